"""What every stage is: a typed config, the stages it reads, and a `run` that fills a directory.

The pipeline (trtbuild/app/pipeline.py) owns keys, the cache, manifests and output links; a stage
only reads its inputs' artifact directories and writes files into `ctx.out_dir`.
Stage modules and what they import at module level must not import heavy libraries (torch,
transformers, modelopt): `trtbuild plan` and a fully cached build must not pay for them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from trtbuild.core.recipe_info import RecipeInfo

# What a stage's work gets and gives lives below the stages, so the packages doing the work use it
# without importing trtbuild.app.stages; re-exported here for the stage modules.
from trtbuild.core.stage_api import Artifact, StageConfig, StageContext, StageResult

__all__ = ["Artifact", "Stage", "StageConfig", "StageContext", "StageResult"]


class Stage:
    """Subclass per stage. Class attributes describe it; `run` does the work."""

    name: ClassVar[str]
    config_cls: ClassVar[type[StageConfig]]
    # Earlier stages whose artifacts this one reads (their keys are part of this stage's key).
    depends_on: ClassVar[tuple[str, ...]] = ()
    # Earlier stages whose artifacts this one reads when the recipe has them (their keys join this key).
    optional_inputs: ClassVar[tuple[str, ...]] = ()
    # Python distributions whose installed versions are part of the key.
    libraries: ClassVar[tuple[str, ...]] = ()

    def key_material(self, config: StageConfig, recipe: RecipeInfo) -> dict[str, Any]:
        """Extra facts outside the config that change the artifact (e.g. a local model's files)."""
        return {}

    def preflight(self, config: StageConfig, recipe: RecipeInfo) -> list[str]:
        """Cheap checks before any work, one line `field: message (fix: ...)` per problem (trtbuild/app/preflight.py)."""
        return []

    def run(self, config: StageConfig, ctx: StageContext) -> StageResult:
        raise NotImplementedError
