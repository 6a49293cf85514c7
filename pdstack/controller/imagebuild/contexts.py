"""The docker build context of each flavor: exactly the files inputs.py hashes, plus wheels from the cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pdstack.controller.imagebuild.common import IMAGES, ROOT
from pdstack.controller.imagebuild.inputs import KERNEL_SOURCES, PROD_TOOLS, SIM_SOURCES, plan_argv
from pdstack.controller.imagebuild.pins import router_version
from pdstack.controller.imagebuild.wheels import build_wheel, download_wheels, link_or_copy, pep508


def prod_context(ctx: Path, series_dir: Path) -> None:
    from pdstack.image.patches import read_series

    shutil.copy2(IMAGES / "prod" / "Dockerfile", ctx / "Dockerfile")
    for f in PROD_TOOLS:
        dst = ctx / "tools" / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dst)
    shutil.copy2(IMAGES / "prod" / "jit_aot.py", ctx / "tools" / "jit_aot.py")
    shutil.copy2(IMAGES / "prod" / "checks.py", ctx / "tools" / "checks.py")
    (ctx / "checks" / "model").mkdir(parents=True)
    shutil.copy2(IMAGES / "prod" / "model-config" / "config.json", ctx / "checks" / "model" / "config.json")
    (ctx / "checks" / "plan-argv.json").write_text(json.dumps(plan_argv(), indent=1, sort_keys=True) + "\n")
    dst = ctx / "patches" / series_dir.name
    dst.mkdir(parents=True)
    shutil.copy2(series_dir / "series", dst / "series")
    for p in read_series(series_dir):
        shutil.copy2(p, dst / p.name)
    kernels = ROOT / "kernels"
    build_wheel(kernels, tuple(str(Path(k).relative_to("kernels")) for k in KERNEL_SOURCES), ctx / "kernels")


def sim_wheels() -> tuple[Path, dict[str, str]]:
    return download_wheels("sim", [f"sglang-router=={router_version()}", "aiohttp", "prometheus-client"])


def sim_context(ctx: Path, folder: Path, wheels: dict[str, str]) -> None:
    shutil.copy2(IMAGES / "sim" / "Dockerfile", ctx / "Dockerfile")
    for w in wheels:
        link_or_copy(folder / w, ctx / "wheels" / w)
    (ctx / "wheels" / "requirements.txt").write_text("".join(f"{pep508(w)}\n" for w in wheels))
    # The pdstack wheel holds only what the sim image runs (inputs.SIM_SOURCES), so only that feeds its tag.
    build_wheel(ROOT, SIM_SOURCES, ctx / "wheels")
