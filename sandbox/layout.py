"""Where the embedded sandbox keeps things: the paths and names world.py, jovian_world.py and
spark_nodes.py share. It imports no other sandbox module, so none of them has to import another's
world to know a path."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

NODES_DIR = "nodes"
# name -> roles; the names are the site's [[spark.nodes]] and [jovian] build_node / lane.nodes.
NODES: dict[str, list[str]] = {"spark-build": ["build"], "spark-a": ["lane"], "spark-b": ["lane"]}
BUILD_NODE = "spark-build"
LANE_NODES = ["spark-a", "spark-b"]


class Sandbox(BaseModel):
    root: Path

    @property
    def site_file(self) -> Path:
        return self.root / "site.toml"

    @property
    def repos(self) -> Path:
        return self.root / "repos"

    @property
    def harbor(self) -> Path:
        return self.repos / "harbor.git"

    @property
    def consumer(self) -> Path:
        return self.repos / "openthoughts-agent.git"

    @property
    def iris_home(self) -> Path:
        return self.root / "iris"

    @property
    def nodes(self) -> Path:
        """The local DGX Spark nodes (sandbox/spark_nodes.py): one directory per node."""
        return self.root / NODES_DIR

    def url(self, bare: Path) -> str:
        return bare.resolve().as_uri()
