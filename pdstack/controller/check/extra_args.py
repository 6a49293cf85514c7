"""extra_args: each entry names a flag of the pinned parser that the planner does not own, with a value the flag
takes and the unit can carry."""

from __future__ import annotations

import difflib
import json
import posixpath
from typing import Any

from pdstack.controller.load import flags, rules
from pdstack.controller.load.tables import REMOTE_PORT_WORDS, SECRET_WORDS
from pdstack.switches import BF16_INDEX_K_ENV, PD_ENV, SM120_INDEXER_ENV, TILELANG_INDEXER_ENV


def dests(parser, table) -> dict[str, tuple[str, str]]:
    """{dest: (flag, variable)} of a flag table."""
    out = {}
    for flag, var in (table.items() if isinstance(table, dict) else ((f, "") for f in table)):
        a = flags.action_for(parser, f"--{flag}")
        if a is None:  # pragma: no cover - the pinned parser changed; test_preflight catches it
            raise RuntimeError(f"--{flag} is not a flag of the pinned parser")
        out[a.dest] = (flag, var)
    return out


def owned_env() -> dict[str, str]:
    """Environment variables the planner sets, and where each comes from."""
    env = {"NVIDIA_VISIBLE_DEVICES": "the server's gpus", "CUDA_VISIBLE_DEVICES": "the server's gpus",
           "PATH": "the image (its PATH finds python3 and the launcher)",
           "LD_LIBRARY_PATH": "the image (its CUDA, NCCL and transfer-engine libraries)",
           "LD_PRELOAD": "the image (nothing is preloaded into the server)",
           "PYTHONPATH": "the image (its python3 finds SGLang and pdstack's patches)",
           "PYTHONHOME": "the image (its python3 installation)",
           "CUDA_HOME": "the image (the CUDA toolkit SGLang's JIT kernels build with)",
           BF16_INDEX_K_ENV: "pdstack_model.index_k_dtype (the same on prefill and decode)",
           SM120_INDEXER_ENV: "pdstack_model.index_k_dtype and gpu_arch",
           TILELANG_INDEXER_ENV: "pdstack_model.index_k_dtype and gpu_arch"}
    env.update({name: f"pdstack_pd.{key}" for key, name in PD_ENV.items()})
    return env


def extra_arg_problems(parser, where: str, key: str, value: Any, owned: dict, refused: dict,
                        what: str, model_path: str | None = None) -> list[str]:
    """Problems of one extra_args entry: the flag exists, is not the planner's, and its value has a form the flag
    takes and the unit can carry. `refused`: {dest: (flag, reason)}."""
    path = f"{where}.extra_args.{key}"
    a = flags.action_for(parser, f"--{key}")
    if a is None:
        options = sorted(o[2:] for o in parser._option_string_actions if o.startswith("--"))
        hint = difflib.get_close_matches(key, options, n=1)
        return [f"{path}: {what} rejects it: --{key} is not one of its flags (spell it exactly, no abbreviations)"
                + (f"; did you mean '{hint[0]}'?" if hint else f"; see `{parser.prog} --help`")]
    if a.dest in owned:
        flag, var = owned[a.dest]
        same = "" if flag == key else f" (it sets the same setting as --{flag}: {a.dest})"
        if var.startswith("nothing"):
            return [f"{path}: the planner renders --{flag} itself{same}, {var[len('nothing '):].strip('()')}; "
                    f"remove extra_args.{key}"]
        return [f"{path}: the planner renders --{flag} itself{same}; set {var} instead and remove extra_args.{key}"]
    if a.dest in refused:
        return [f"{path}: {refused[a.dest]}; remove extra_args.{key}"]
    if value is None:
        return [f"{path}: no value (YAML null); write true for a switch, the value for a flag, or remove the key"]
    if value is False:
        return []
    if a.nargs == 0 and value is not True:
        return [f"{path}: --{key} is a switch and takes no value, got {value!r}; write true (or false to leave it "
                "off)"]
    if value is True and a.nargs not in (0, "?"):
        return [f"{path}: --{key} takes a value, got true; write the value (e.g. {key}: {a.default!r})"
                if a.default not in (None, False) else f"{path}: --{key} takes a value, got true; write the value"]
    if isinstance(value, dict) and not flags.takes_json(a):
        return [f"{path}: a mapping, but --{key} takes {'a list of values' if flags.takes_many(a) else 'one value'}"
                "; write the value itself (mappings are written as JSON only for flags that take JSON)"]
    if isinstance(value, list) and not (flags.takes_json(a) or flags.takes_many(a)):
        return [f"{path}: a list, but --{key} takes one value; write one value"]
    if isinstance(value, list) and flags.takes_many(a) and not flags.takes_json(a):
        bad = [v for v in value if isinstance(v, bool | dict | list) or v is None]
        if bad:
            return [f"{path}: list items {bad!r} are not plain values; --{key} takes strings or numbers"]
        if not value and a.nargs == "+":
            return [f"{path}: an empty list, but --{key} needs at least one value"]
    if isinstance(value, str) and flags.takes_json(a) and value.lstrip()[:1] in "{[":
        try:
            json.loads(value)
        except ValueError as e:
            return [f"{path}: --{key} takes JSON, and {value!r} is not valid JSON ({e}); write it as a YAML mapping "
                    "and pdstack renders the JSON"]
    out = []
    if any(w in a.dest for w in SECRET_WORDS):
        out.append(f"{path}: --{key} is a secret, and extra_args land in the unit, /etc/pdstack/plan.json "
                   "(world-readable) and the journal; pdstack has no secret store for it: remove it")
    path_valued = any(w in a.dest for w in ("path", "file", "template", "config", "dir"))
    if path_valued and isinstance(value, str):
        out.extend(_path_problems(path, key, value, model_path if what.startswith("SGLang") else None,
                                  at_file="config" in a.dest))
    try:
        words = flags.render_value(value, a, key)
    except flags.Unrenderable as e:  # the argv encoder refuses it: name it here, with the rest of the problems
        return [*out, f"{path}: {str(e).split(': ', 1)[1]}"]
    for word in words:
        if msg := rules.unit_value_problem(word):
            out.append(f"{path}: {msg}; change the value"
                       + (" (JSON is written compactly, but strings inside it must not hold spaces)"
                          if isinstance(value, dict | list) else ""))
    return out


def _path_problems(path: str, key: str, value: str, mount: str | None, at_file: bool) -> list[str]:
    """A path-valued flag names a file inside the one host directory the container mounts (pdstack_model.path),
    checked by normalised containment: `<model>/../../etc/x.jinja` is outside, whatever its prefix. `at_file`: the
    flag also takes '@FILE' (SGLang's config flags read the file after the '@')."""
    v = value[1:] if at_file and value.startswith("@") else value
    if not v.startswith("/"):
        if ".." in v.split("/"):
            return [f"{path}: {value} climbs out of the container's working directory with '..' (which mounts "
                    "nothing); give an absolute path under pdstack_model.path" + (f" {mount}" if mount else "")]
        return []  # a name (a built-in chat template, a Hugging Face id), not a path
    if mount is None:
        return [f"{path}: {v} is a host path, but the router's container mounts no host directory; remove --{key}"]
    if not rules.path_within(v, mount):
        norm = posixpath.normpath(v)
        shown = v if norm == v else f"{v} (that is {norm})"
        return [f"{path}: {shown} is outside pdstack_model.path {mount}, the only host directory the server's "
                f"container mounts (read-only); put the file under {mount} and point --{key} there"]
    return []


def listener_ports(parser, extra: dict) -> list[tuple[int, str, str]]:
    """(port, key, dest) of every extra flag that makes the server listen on a port."""
    out = []
    for key, value in extra.items():
        a = flags.action_for(parser, f"--{key}")
        if a is None or not a.dest.endswith("_port") or any(w in a.dest for w in REMOTE_PORT_WORDS):
            continue
        if isinstance(value, str) and a.type is int:  # "30001" is the port 30001 to SGLang
            try:
                value = int(value.strip())
            except ValueError:
                continue  # the parser check names it
        if isinstance(value, int) and not isinstance(value, bool):
            out.append((value, key, a.dest))
    return out
