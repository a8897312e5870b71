"""Where the bundled fixtures live.

A wheel carries them inside the package (`_bundled_fixtures`); a source
checkout or an editable install uses the repository's top-level `fixtures/`.
"""

from pathlib import Path


def fixtures_dir() -> Path:
    package = Path(__file__).resolve().parent
    bundled = package / "_bundled_fixtures"
    if bundled.is_dir():
        return bundled
    return package.parent / "fixtures"
