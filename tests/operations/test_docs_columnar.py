"""The first example of docs/client-columnar.md, run as written against two real replicas."""

import re

import pytest

from tests.support.server import REPO

pytestmark = [pytest.mark.http]


def first_example() -> str:
    text = (REPO / "docs/client-columnar.md").read_text()
    section = text[text.index("## The handles' `*_many` methods") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_many_methods_example_runs_as_written(two_replicas, job_name):
    code = first_example()
    urls = re.findall(r'"(http://sh-\d:8000)"', code)
    assert len(urls) == 2, code  # the example addresses two replicas
    for url, server in zip(urls, two_replicas, strict=True):
        code = code.replace(url, server.url)
    code = code.replace('create_job("basket"', f'create_job("{job_name}"')
    scope: dict = {}
    exec(compile(code, "docs/client-columnar.md", "exec"), scope)
    df = scope["df"]
    assert df["spent"].tolist() == [15.5, 2.0, 15.5]
    assert str(df["spent"].dtype) == "float64"
    assert df["count"].tolist() == [1, 1, 1] and str(df["count"].dtype) == "Int64"
