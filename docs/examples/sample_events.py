"""Write sample purchase events for the user-features pipeline.

python -m docs.examples.sample_events --output events/ --files 3 --events 1000
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ITEMS = ("book", "pen", "ink", "lamp", "mug", "desk")


def write_events(output: Path, files: int, events: int, users: int = 100, seed: int = 7) -> None:
    rng = random.Random(seed)
    output.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lines = (
            json.dumps(
                {
                    "user_id": f"user-{rng.randrange(users)}",
                    "item": rng.choice(ITEMS),
                    "amount": round(rng.uniform(1, 500), 2),
                    "event_time": f"2026-11-23T{f % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z",
                }
            )
            for i in range(events)
        )
        (output / f"events-{f:04d}.json").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="write sample events for docs.examples.user_features")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--events", type=int, default=1000, help="events per file")
    parser.add_argument("--users", type=int, default=100)
    args = parser.parse_args()
    write_events(args.output, args.files, args.events, args.users)


if __name__ == "__main__":
    main()
