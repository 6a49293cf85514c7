"""The docker build context of each flavor: exactly the files inputs.py hashes, plus the sim's install lists.

The sim's wheels themselves stay in the host's cache: the build installs them over HTTP (wheels.serve_wheels), so
they are neither sent as context nor kept in a layer, and the image needs no install stage to copy out of."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pdstack.controller.imagebuild.common import IMAGES, ROOT
from pdstack.controller.imagebuild.inputs import KERNEL_SOURCES, PROD_TOOLS, SIM_SOURCES, plan_argv
from pdstack.controller.imagebuild.pins import pin, router_version, sglang_version, torch_version
from pdstack.controller.imagebuild.wheels import build_wheel, download_wheels, pep508


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


# What SGLang's tool-call detector and reasoning parser import (pdstack/testing/sim/parsing.py); sglang and xgrammar
# themselves go in --no-deps (their own requirements are GPU builds).
SIM_PARSER_WHEELS = ["openai", "transformers", "partial_json_parser", "regex", "pydantic", "orjson", "msgspec",
                     "pybase64", "requests", "pillow", "ipython", "numpy", "apache-tvm-ffi"]
SIM_NO_DEPS = ["xgrammar"]


def sim_wheels() -> tuple[Path, dict[str, str]]:
    return download_wheels("sim", [f"sglang-router=={router_version()}", "aiohttp", "prometheus-client",
                                   f"torch=={torch_version()}", *SIM_PARSER_WHEELS],
                           no_deps=[f"sglang=={sglang_version()}",
                                    *(f"{w}=={pin(ROOT / 'requirements' / 'lock.txt', w)}" for w in SIM_NO_DEPS)])


def sim_context(ctx: Path, wheels: dict[str, str]) -> None:
    shutil.copy2(IMAGES / "sim" / "Dockerfile", ctx / "Dockerfile")
    (ctx / "wheels").mkdir(parents=True)
    no_deps = [w for w in wheels if w.startswith(("sglang-", *(f"{n}-" for n in SIM_NO_DEPS)))]
    # each line pins the wheel's sha256 (pip --require-hashes): the image holds exactly the cache's files
    lines = {w: f"{pep508(w)} --hash=sha256:{digest}\n" for w, digest in wheels.items()}
    (ctx / "wheels" / "requirements.txt").write_text("".join(lines[w] for w in wheels if w not in no_deps))
    (ctx / "wheels" / "no-deps.txt").write_text("".join(lines[w] for w in no_deps))
    # The pdstack wheel holds only what the sim image runs (inputs.SIM_SOURCES), so only that feeds its tag.
    build_wheel(ROOT, SIM_SOURCES, ctx / "wheels")
