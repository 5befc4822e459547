"""Sphinx configuration of the trainscale site (`make docs`).

The pages in this folder are written by hand; `trainscale.interface.docs.build` copies them into a build folder and adds
the generated ones there (studies/, studies.md, _generated/): never edit a number that a dataset holds here, use a
substitution (`{{ mape_published }}`, from figures/validation/validation.nc) or a generated include.
"""

import json
from pathlib import Path

import trainscale

project = "trainscale"
author = "the trainscale authors"
copyright = "the trainscale authors (see CITATION.cff)"
release = trainscale.__version__ if hasattr(trainscale, "__version__") else ""

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "_generated/*", "**/.ipynb_checkpoints"]

# The executed notebooks are published by the workflow (figures/<study>/<study>.ipynb): render, never run them.
nb_execution_mode = "off"
nb_render_markdown_format = "myst"  # a notebook's figure outputs are MyST figure directives with captions
nb_merge_streams = True

myst_enable_extensions = ["colon_fence", "substitution", "dollarmath", "deflist"]
myst_heading_anchors = 3
_generated = Path(__file__).parent / "_generated" / "substitutions.json"
myst_substitutions = json.loads(_generated.read_text()) if _generated.is_file() else {}

# A notebook's own headings start at its title and some skip a level; MyST's note on it is not a broken page.
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_numpy_docstring = True

html_theme = "sphinx_book_theme"
html_title = "trainscale"
html_theme_options = {"show_toc_level": 2, "use_download_button": False, "use_fullscreen_button": False,
                      "home_page_in_toc": True}
html_show_sourcelink = False
html_copy_source = False
