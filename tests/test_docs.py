"""The docs a newcomer reads are true to the tree: every link and path they name resolves, README stays short,
docs/layout.md lists every module, docs/cli.md every command, and nothing in the repo cites a file it does not ship.

A user's clone has no ../shared (the workplace's notes): what the project relies on is in docs/facts.md, in its own
words, and that is what code and docs cite.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 200

# The topics the reference is split into (issue 24); each is a file under docs/.
TOPICS = ["inventory", "images", "model", "admission", "failure", "rollouts", "monitoring", "smoke-and-watchdog",
          "testing", "kernels", "layout", "cli", "facts", "pipeline", "tune"]

# Files of pdstack/controller/ whose comments still cite FACTS.md: other branches rewrite these modules, and the
# comments are fixed when they merge. The list may only shrink: a file here that no longer cites it fails the test
# below, so whoever fixes one removes it from the list too.
PENDING_CONTROLLER_COMMENTS: dict[str, str] = {  # file -> what to cite instead (none left)
}

# Docker image repositories pdstack builds: spelled like paths, but images, not files.
IMAGE_REPOSITORIES = {"pdstack/pybase", "pdstack/sim", "pdstack/sglang", "pdstack/sglang-base", "pdstack/testhost-base"}

# What a clone of the repo does not have: the workplace's notes and seeds beside it.
UNSHIPPED = re.compile(r"FACTS\.md|\.\./shared|shared/seeds|/work/shared")
# A test may read a fixture of the shared workplace on purpose, if it skips with a reason naming it when absent.
SKIPS_WITHOUT_SHARED = re.compile(r"pytest\.(?:skip|mark\.skipif)\([^)]*shared", re.S)


def md_files() -> list[Path]:
    """Every markdown file the repo ships: README.md and docs/ first, then the role, kernel and sim READMEs."""
    rest = [ROOT / f for f in repo_files() if f.endswith(".md") and ROOT / f not in (README, *DOCS)]
    return [README, *DOCS, *rest]


def ignored(paths: list[str]) -> set[str]:
    """The paths git ignores: build outputs (kernels/build/..., build/...) that a doc may name but no clone has."""
    if not paths:
        return set()
    r = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, input="\n".join(paths),
                       capture_output=True, text=True)
    return set(r.stdout.splitlines())


@functools.cache
def repo_files() -> tuple[str, ...]:
    """Tracked files plus untracked ones git does not ignore (what a commit of this tree would ship)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return tuple(sorted({f for f in out.splitlines() if (ROOT / f).is_file()}))


def strip_code_blocks(text: str) -> str:
    """Markdown outside fenced code blocks (a link or heading inside a fence is not one)."""
    return re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lowercase, punctuation dropped except - and _, spaces -> -,
    a repeated slug gets -1, -2, ..."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in strip_code_blocks(text).splitlines():
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        anchors.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return anchors


def links(text: str) -> list[str]:
    return re.findall(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", strip_code_blocks(text))


def test_github_anchor_rules():
    text = "# A `b` (c): d\n## Dup\n## Dup\n```\n# not a heading\n```\n### site.yml's phases\n  ```\n# no\n  ```\n"
    assert github_anchors(text) == {"a-b-c-d", "dup", "dup-1", "siteymls-phases"}


@pytest.mark.parametrize("md", md_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(md: Path):
    broken = []
    for target in links(md.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            broken.append(f"{target}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist")
            continue
        if not dest.is_relative_to(ROOT):
            broken.append(f"{target}: points outside the repository")
            continue
        if anchor:
            if dest.suffix != ".md":
                broken.append(f"{target}: an anchor into a file that is not markdown")
            elif anchor not in github_anchors(dest.read_text()):
                broken.append(f"{target}: {dest.relative_to(ROOT)} has no heading with anchor #{anchor} "
                              f"(it has: {', '.join(sorted(github_anchors(dest.read_text())))})")
    assert not broken, f"{md.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


@functools.cache
def top_level() -> frozenset[str]:
    return frozenset(f.split("/", 1)[0] for f in repo_files())


def named_paths(text: str) -> list[str]:
    """Backticked repo paths: `roles/serving/tasks/restart.yml`, `pdstack/...py`, `kernels/csrc` ... A path with a
    placeholder (<role>, *, {a,b}, ...) names a family of files, not one, and is left out."""
    tops = top_level() - {"build"}
    found = []
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.split("#", 1)[0].rstrip(".,:;")  # a section of a file: the file
        first = token.split("/", 1)[0]
        if first not in tops or token in IMAGE_REPOSITORIES or re.search(r"[<>*{}|$]|\.\.\.", token):
            continue
        if "/" in token or "." in token:
            found.append(token)
    return found


@pytest.mark.parametrize("md", md_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repo_path_the_docs_name_exists(md: Path):
    missing = []
    for n, line in enumerate(md.read_text().splitlines(), start=1):
        if "(landing with " in line:  # a module another branch adds: listed ahead of its merge
            continue
        missing += [(n, p) for p in named_paths(line) if not (ROOT / p).exists()]
    outputs = ignored([p for _, p in missing])
    missing = [f"line {n}: `{p}`" for n, p in missing if p not in outputs]
    assert not missing, (f"{md.relative_to(ROOT)} names paths that are not in the repository (fix the path, or "
                         "the doc):\n" + "\n".join(missing))


def test_named_paths_finds_paths_and_skips_families():
    text = "`roles/serving/tasks/restart.yml`, `roles/<role>/README.md`, `pdstack/cli.py`, `/etc/pdstack/x`, `site.yml`"
    assert named_paths(text) == ["roles/serving/tasks/restart.yml", "pdstack/cli.py", "site.yml"]


def test_readme_is_short_and_keeps_the_two_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, (f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move "
                                            "reference into docs/ (one file per topic) and link it")
    # the quick start, exactly as CI and newcomers use it (.ci/run runs ./dev.sh test)
    assert "./dev.sh demo     # the main job:" in text and "./dev.sh test     # the whole test suite:" in text
    run = [x for x in (ROOT / ".ci" / "run").read_text().splitlines() if x.strip() and not x.startswith("#")]
    assert run[-1] == "exec ./dev.sh test", f".ci/run must end by running the README's test command: {run}"
    for topic in TOPICS:
        assert f"(docs/{topic}.md" in text, f"README.md's 'where to read next' does not link docs/{topic}.md"


@pytest.mark.parametrize("topic", TOPICS)
def test_each_topic_has_its_doc_with_a_table_of_contents_when_long(topic: str):
    doc = ROOT / "docs" / f"{topic}.md"
    assert doc.is_file(), f"docs/{topic}.md is missing"
    text = doc.read_text()
    assert text.startswith("# "), f"docs/{topic}.md: starts with a '# ' title"
    sections = [h for h in strip_code_blocks(text).splitlines() if h.startswith("## ")]
    if len(text.splitlines()) > 80 and len(sections) > 1:
        toc = [a for a in links(text.split("\n## ", 1)[0]) if a.startswith("#")]
        assert len(toc) >= len(sections), f"docs/{topic}.md is long: its top needs a table of contents of its sections"


def package_modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pdstack").rglob("*.py") if "__pycache__" not in p.parts)


def test_layout_lists_every_module_of_the_package():
    layout = (ROOT / "docs" / "layout.md").read_text()
    listed = set(re.findall(r"^- `(pdstack/[^`]+)`", layout, flags=re.M))
    missing = [m for m in package_modules() if m not in listed]
    assert not missing, "docs/layout.md does not list these modules (one line each, under its group):\n" + "\n".join(
        missing)
    assert len(listed) >= len(package_modules()) > 50


def test_cli_lists_every_pdstack_subcommand_and_invoke_task():
    from invoke import Collection

    import tasks
    from pdstack.cli import COMMANDS

    cli = (ROOT / "docs" / "cli.md").read_text()
    missing = [f"pdstack {c}" for c in COMMANDS if f"`pdstack {c}" not in cli]

    def names(coll: Collection, prefix: str = "") -> list[str]:
        out = [prefix + t for t in coll.tasks]
        for name, sub in coll.collections.items():
            out += names(sub, f"{prefix}{name}.")
        return out

    for name in names(tasks.ns):
        short = name.removesuffix(".image")  # build.image is the default of `build`: `invoke build`
        if f"`invoke {name}" not in cli and f"`invoke {short}" not in cli:
            missing.append(f"invoke {name}")
    assert not missing, "docs/cli.md does not describe: " + ", ".join(missing)


TEXT_SUFFIXES = (".md", ".py", ".yml", ".yaml", ".j2", ".sh", ".cfg", ".toml")


def doc_mentions() -> list[tuple[str, int, str, str]]:
    """Every `docs/<topic>.md[#anchor]` the repo names (in docs/ itself also `<topic>.md#anchor`): (file, line, doc,
    anchor or "")."""
    out = []
    for f in repo_files():
        if f == "tests/test_docs.py" or not f.endswith(TEXT_SUFFIXES):
            continue
        pattern = r"(?<![\w/.-])(?:docs/)?([\w-]+)\.md(?:#([\w-]+))?" if f.startswith("docs/") else \
            r"(?<![\w/.-])docs/([\w-]+)\.md(?:#([\w-]+))?"
        for n, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), start=1):
            for doc, anchor in re.findall(pattern, line):
                if f.startswith("docs/") and not (ROOT / "docs" / f"{doc}.md").exists() and not anchor:
                    continue  # README.md, RESULTS.md ... named in passing, not a doc of docs/
                out.append((f, n, doc, anchor))
    return out


def test_every_mention_of_a_doc_names_one_that_exists_and_its_section():
    """A comment or doc that says `docs/failure.md` or `docs/facts.md#sglang-router-032` points at something real."""
    wrong = []
    for f, n, doc, anchor in doc_mentions():
        path = ROOT / "docs" / f"{doc}.md"
        if not path.exists():
            wrong.append(f"{f}:{n}: docs/{doc}.md does not exist")
        elif anchor and anchor not in github_anchors(path.read_text()):
            wrong.append(f"{f}:{n}: docs/{doc}.md has no section #{anchor} "
                         f"(it has {sorted(github_anchors(path.read_text()))})")
    assert not wrong, "\n".join(wrong)
    facts = [m for m in doc_mentions() if m[2] == "facts" and m[3] and not m[0].startswith("docs/facts.md")]
    assert len(facts) >= 10, "code and docs cite docs/facts.md by section"


def test_nothing_cites_a_file_the_repo_does_not_ship():
    offenders: dict[str, list[str]] = {}
    for f in repo_files():
        if f == "tests/test_docs.py":
            continue
        try:
            text = (ROOT / f).read_text()
        except UnicodeDecodeError:  # binary files (images, tarballs) cite nothing
            continue
        hits = [f"{n}: {line.strip()[:100]}" for n, line in enumerate(text.splitlines(), start=1)
                if UNSHIPPED.search(line)]
        if hits and not (f.startswith("tests/") and SKIPS_WITHOUT_SHARED.search(text)):
            offenders[f] = hits
    new = {f: h for f, h in offenders.items() if f not in PENDING_CONTROLLER_COMMENTS}
    assert not new, ("these files cite FACTS.md or ../shared, which a clone of the repo does not have; cite "
                     "docs/facts.md#<section> (add the fact there, in our words, with its command or upstream file):\n"
                     + "\n".join(f"{f}:{h}" for f, hits in new.items() for h in hits))
    fixed = sorted(set(PENDING_CONTROLLER_COMMENTS) - set(offenders))
    assert not fixed, f"no longer cite FACTS.md: remove them from PENDING_CONTROLLER_COMMENTS: {fixed}"


# Comments in these pdstack/controller/ files still point at README sections that moved to docs/ (fixed at the
# merge, as above; the list may only shrink).
PENDING_CONTROLLER_README: dict[str, str] = {  # file -> what to cite instead (none left)
}
README_SECTION = re.compile(r"(?<![/\w])README(?:\.md)?(?:'s)?,?\s+\(?\"([^\"]+)\"")


def test_references_to_a_readme_section_name_one_it_has():
    """`README "Rollouts"` in a comment must still be a section of README.md: the reference moved to docs/ must be
    cited there (docs/rollouts.md), not where it used to be."""
    headings = {h.lower() for h in re.findall(r"^#+\s+(.*?)\s*$", strip_code_blocks(README.read_text()), flags=re.M)}
    stale: dict[str, list[str]] = {}
    for f in repo_files():
        if f == "tests/test_docs.py" or not f.endswith(TEXT_SUFFIXES):
            continue
        for n, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), start=1):
            for section in README_SECTION.findall(line):
                if section.lower() not in headings:
                    stale.setdefault(f, []).append(f"{n}: README \"{section}\"")
    new = {f: s for f, s in stale.items() if f not in PENDING_CONTROLLER_README}
    assert not new, ("these name a README.md section it does not have (the reference is in docs/ now: cite the doc):\n"
                     + "\n".join(f"{f}:{s}" for f, ss in new.items() for s in ss))
    fixed = sorted(set(PENDING_CONTROLLER_README) - set(stale))
    assert not fixed, f"no longer cite a moved README section: remove them from PENDING_CONTROLLER_README: {fixed}"


def test_readme_section_pattern():
    found = README_SECTION.findall('a (README, "Failure behaviour") b; README "Rollouts"; sim/README.md "Faults"')
    assert found == ["Failure behaviour", "Rollouts"]


def named_code(text: str) -> list[tuple[str, str]]:
    """What the docs say lives where: `pdstack.a.b.name` (a module, or a name it defines) and `NAME` in `path.py`.
    Returns (the name as written, the problem); a dotted name ending in a file suffix (`pdstack.prom`) is a file."""
    problems = []
    for name in re.findall(r"`(pdstack(?:\.[A-Za-z_]\w*)+)`", text):
        parts = name.split(".")
        if parts[-1] in {"prom", "json", "fact", "yml", "py"}:
            continue
        for i in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:i])
            src = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            if src.is_file():
                break
        else:
            problems.append((name, "no such module"))
            continue
        rest = parts[i:]
        if rest and not re.search(rf"^\s*(?:def|class)\s+{rest[0]}\b|^\s*{rest[0]}\s*[:=]", src.read_text(), re.M):
            problems.append((name, f"{src.relative_to(ROOT)} defines no {rest[0]}"))
    for sym, path in re.findall(r"`([A-Za-z_]\w*)(?:\(\))?` in\s+`([\w/.-]+\.py)`", text):
        if (ROOT / path).is_file() and not re.search(rf"\b{sym}\b", (ROOT / path).read_text()):
            problems.append((sym, f"not in {path}"))
    return problems


@pytest.mark.parametrize("md", md_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_code_the_docs_name_is_where_they_say(md: Path):
    problems = named_code(md.read_text())
    assert not problems, f"{md.relative_to(ROOT)}: " + "; ".join(f"`{n}`: {why}" for n, why in problems)


def test_named_code_finds_a_moved_name():
    text = ("`pdstack.hostside.watchdog.worst_case_restart_s`, `pdstack.nothere`, `pdstack.prom`, `LISTENERS` in "
            "`pdstack/controller/check/preflight.py`, `LISTENERS` in `pdstack/controller/check/network.py`")
    assert [n for n, _ in named_code(text)] == ["pdstack.nothere", "LISTENERS"]
