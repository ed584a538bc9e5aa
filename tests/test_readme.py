"""The README stays true: its Python examples run, and every command it shows exists.

Shell commands (```bash, ```sh and ```console blocks, and `make <target>` written inline)
are checked cheaply instead of run: a make target as a dry run (`make -n`), JupyterLab
by asking it for its version, a `pip install` line by reading its requirements against
`pyproject.toml` (extras, the release tag, the repository URL) and `requirements.txt`.
A command of a form this file does not know fails, so a new one gets a check.
The book's how-to-run page includes the README's middle part, so the two cannot differ.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
REPOSITORY = CONFIG["repository"]["url"]
IN_PROJECT_VENV = Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()


def shell_commands(text: str) -> list[str]:
    """The commands of the shell blocks (indented ones in lists too), comments removed."""
    commands = []
    blocks = re.findall(r"^([ \t]*)```(?:bash|sh|console)\n(.*?)^\1```", text, re.S | re.M)
    for _indent, body in blocks:
        for line in textwrap.dedent(body).splitlines():
            line = re.sub(r"(^|\s+)#.*$", "", line.strip().removeprefix("$ "))
            if line:
                commands.append(line)
    return commands


def inline_make_commands(text: str) -> list[str]:
    """`make <target>` (and its variables) written inline in the prose or tables."""
    return re.findall(r"`(make [a-z][\w-]*(?: [A-Z_]+=[^`\s]+)*)`", text)


COMMANDS = shell_commands(README)
MAKE_COMMANDS = sorted(
    {c for c in COMMANDS if c.startswith("make ")} | set(inline_make_commands(README))
)


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; make test-oldest may be on 3.10
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def check_pip_install(args: list[str]) -> None:
    """Each requirement of `pip install ARGS` exists in this project or its pins."""
    project = _project()
    extras_declared = set(project.get("optional-dependencies", {}))
    requirements, options = [], iter(args)
    for arg in options:
        if arg in ("--index-url", "--extra-index-url"):
            assert next(options).startswith("https://"), args
        elif arg in ("-e", "--editable"):
            requirements.append(next(options))
        elif arg.startswith("-"):
            raise AssertionError(f"pip install option {arg} has no check in {__file__}")
        else:
            requirements.append(arg)
    assert requirements, args
    for requirement in requirements:
        if requirement.startswith("."):  # the checkout itself, with extras
            path, _, extras = requirement.partition("[")
            assert path == ".", requirement
            assert (ROOT / "pyproject.toml").exists()
            assert set(filter(None, extras.rstrip("]").split(","))) <= extras_declared
        elif requirement.endswith(".whl"):  # the wheel `pip wheel . -w dist` writes
            name, version, *_ = Path(requirement).name.split("-")
            assert (name, version) == (project["name"], project["version"]), requirement
        else:
            parsed = Requirement(requirement)
            if parsed.name == project["name"]:
                assert parsed.extras <= extras_declared, requirement
                assert parsed.url == f"git+{REPOSITORY}@v{project['version']}", requirement
            else:  # a pinned dependency, installed ahead of the pins (PyTorch's CPU build)
                pin = _pins()[parsed.name.lower()]
                assert str(parsed.specifier) == f"=={pin}", (requirement, pin)


def check_command(command: str) -> None:
    words = shlex.split(command)
    if words[0] == "make":
        result = subprocess.run(
            ["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
    elif words[:3] == ["python3", "-m", "venv"]:
        assert importlib.util.find_spec("venv") is not None
    elif words[:3] == [".venv/bin/python", "-m", "pip"] or words[0] == "pip":
        pip = words[3:] if words[0] != "pip" else words[1:]
        if pip[0] == "install":
            check_pip_install(pip[1:])
        elif pip[0] == "wheel":
            assert pip[1:] == ["--no-deps", ".", "-w", "dist"], pip
        else:
            raise AssertionError(f"no check for `pip {pip[0]}` in {__file__}")
    elif words[:2] == ["python", "-m"] and words[2].startswith("pecode."):
        # a pecode command: it exists and takes the options shown
        result = subprocess.run(
            [sys.executable, "-m", words[2], "--help"], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        for option in (word for word in words[3:] if word.startswith("--")):
            assert option in result.stdout, option
    elif words[0] == ".venv/bin/jupyter":
        assert words[1] == "lab", command
        for path in words[2:]:
            assert (ROOT / path).exists(), path
        if not IN_PROJECT_VENV:
            pytest.skip("JupyterLab is checked in the project's .venv, where the README runs it")
        jupyter = ROOT / ".venv" / "bin" / "jupyter"
        result = subprocess.run(
            [str(jupyter), "lab", "--version"], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
    else:
        raise AssertionError(f"the README shows `{command}`, which {__file__} cannot check")


def test_readme_has_examples():
    assert BLOCKS
    # the commands a reader needs: set up, run a notebook, install the package
    for expected in ("make book", "make test", ".venv/bin/jupyter lab", "pip install ."):
        assert any(c.startswith(expected) for c in COMMANDS), expected


@pytest.mark.parametrize("source", BLOCKS, ids=lambda s: s.splitlines()[0][:40])
def test_readme_example_runs(source):
    if re.search(r"^from transformers import", source, re.M):
        pytest.importorskip("transformers")  # not in make test-oldest's environment
    exec(compile(source, "README.md", "exec"), {"__name__": "readme_example"})


@pytest.mark.parametrize("command", [c for c in COMMANDS if not c.startswith("make ")])
def test_readme_command_exists(command):
    check_command(command)


@pytest.mark.parametrize("command", MAKE_COMMANDS)
def test_readme_make_command_is_a_target(command):
    check_command(command)


@pytest.mark.parametrize(
    "command",
    [
        "make no-such-target",
        ".venv/bin/jupyter lab notebooks/00_missing.ipynb",
        'pip install ".[no-such-extra]"',
        'pip install "pecode @ git+https://github.com/someone/else@v0.1.0"',
        "pip install torch==1.0.0",
        "conda install pecode",
        "python -m pecode.no_such_module config.json",
        "python -m pecode.inspect_config config.json --no-such-option 1",
    ],
)
def test_a_wrong_command_fails_its_check(command):
    with pytest.raises(AssertionError):
        check_command(command)


def test_the_how_to_run_page_is_the_readme():
    """book/how_to_run.md includes the README's part between two markers, once each."""
    page = (ROOT / "book" / "how_to_run.md").read_text(encoding="utf-8")
    start, end = re.search(
        r"```\{include\} \.\./README\.md\n:start-after: (.+)\n:end-before: (.+)\n```", page
    ).groups()
    assert README.count(start) == 1
    assert README.count(end) == 1
    included = README.split(start)[1].split(end)[0]
    for section in ("## Set up", "## Run a notebook", "## Use the package", "## How the book"):
        assert section in included, section
    # the page adds no commands or run times of its own, which could drift from the README
    own = page.split("```{include}")[0]
    assert not re.search(r"make |minutes|pip install", own), own
