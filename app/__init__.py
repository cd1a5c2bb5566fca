"""Statehouse's HTTP service: thin routers over the state engine in ``backends``."""
