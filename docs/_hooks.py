"""MkDocs hooks for the pinet_eqx documentation (see `hooks:` in mkdocs.yml).

- Files outside `docs/` that the pages show or link to (the benchmark results and
  their figures, the example scripts and figures) are added to the site at their
  repository paths, so one copy of each exists and links are checked.
- MathJax 3 (the `tex-mml-chtml` component, its fonts and TeX extensions) is
  copied into the site from the `django-static-mathjax` package (the `docs`
  extra), so the maths renders without a network connection.
- The build fails if a public name of `pinet_eqx` has no `::: pinet_eqx.<name>`
  entry in `docs/api/`, or no docstring.
"""

import glob
import os
import re
import types

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXTERNAL = [
    "benchmarks/RESULTS.md",
    "benchmarks/*/RESULTS.md",
    "benchmarks/figures/**/*.png",
    "examples/*.py",
    "examples/figures/**/*.png",
]


def _public_names() -> list[str]:
    import pinet_eqx

    return sorted(
        name
        for name, obj in vars(pinet_eqx).items()
        if not name.startswith("_") and not isinstance(obj, types.ModuleType)
    )


# What the site needs of MathJax's es5 build, relative to it; served from
# `_static/mathjax/`, where mkdocs.yml loads `tex-mml-chtml.js`.
_MATHJAX = [
    "tex-mml-chtml.js",
    "output/chtml/fonts/woff-v2/*.woff",
    "input/tex/extensions/*.js",
]


def _mathjax_dir() -> str:
    try:
        import mathjax  # django-static-mathjax: MathJax's files, no dependencies
    except ImportError as e:
        raise PluginError(
            "The docs need MathJax from the `docs` extra: pip install -e '.[docs]'."
        ) from e
    return os.path.join(os.path.dirname(mathjax.__file__), "static", "mathjax", "es5")


def on_files(files, config):
    for pattern in _EXTERNAL:
        for path in sorted(glob.glob(os.path.join(_ROOT, pattern), recursive=True)):
            rel = os.path.relpath(path, _ROOT).replace(os.sep, "/")
            files.append(
                File(rel, _ROOT, config["site_dir"], config["use_directory_urls"])
            )
    es5 = _mathjax_dir()
    for pattern in _MATHJAX:
        paths = sorted(glob.glob(os.path.join(es5, pattern)))
        if not paths:
            raise PluginError(f"MathJax's {pattern} is missing under {es5}.")
        for path in paths:
            rel = os.path.relpath(path, es5).replace(os.sep, "/")
            files.append(
                File.generated(config, f"_static/mathjax/{rel}", abs_src_path=path)
            )
    return files


def on_pre_build(config):
    import pinet_eqx

    documented = set()
    for path in glob.glob(os.path.join(config["docs_dir"], "api", "*.md")):
        with open(path) as f:
            documented |= set(re.findall(r"^::: pinet_eqx\.(\w+)", f.read(), re.M))
    names = _public_names()
    missing = [n for n in names if n not in documented]
    if missing:
        raise PluginError(f"docs/api/ has no `::: pinet_eqx.<name>` entry: {missing}.")
    undocumented = [n for n in names if not getattr(pinet_eqx, n).__doc__]
    if undocumented:
        raise PluginError(f"pinet_eqx names without a docstring: {undocumented}.")
