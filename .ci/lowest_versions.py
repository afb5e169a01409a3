"""Print a pip constraints file that pins every direct dependency of vaswani to the lowest version pyproject.toml allows.

    python3 .ci/lowest_versions.py test > lowest.txt && pip install -c lowest.txt -e ".[test]"

pip has no lowest-version resolution of its own; this is uv's `--resolution lowest-direct`: the requirements that
pyproject.toml lists, for the base install and the named extras (followed through `vaswani[...]`), at their lower
bounds; everything they pull in at the newest version that fits. A requirement without a lower bound is left free.
"""

import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement


def direct_requirements(project: dict, extras: list[str]) -> list[Requirement]:
    requirements = [Requirement(line) for line in project["dependencies"]]
    seen, pending = set(), list(extras)
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in project["optional-dependencies"][extra]:
            requirement = Requirement(line)
            if requirement.name == project["name"]:
                pending.extend(requirement.extras)
            else:
                requirements.append(requirement)
    return requirements


def lowest_pin(requirement: Requirement) -> str | None:
    bounds = [spec.version for spec in requirement.specifier if spec.operator in (">=", "==", "~=")]
    return f"{requirement.name}=={bounds[0]}" if bounds else None


def main() -> None:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    pins = {lowest_pin(requirement) for requirement in direct_requirements(project, sys.argv[1:])}
    print("\n".join(sorted(pin for pin in pins if pin)))


if __name__ == "__main__":
    main()
