"""The project's committed outputs: ``trainscale verify`` (every study's paper comparison from its datasets),
``gallery`` (the README's gallery and verdict counts), ``docs`` (the documentation site), ``publish-notebook``
and ``install-outputs`` (the workflow's last steps).
"""

from __future__ import annotations

import os
from pathlib import Path

from .shared import CLIError, _require_file


def cmd_verify(args) -> int:
    from .. import verify

    _require_file(args.config, "--config")
    try:
        checks = verify.verify(args.figures, args.config, args.study, write=args.write)
    except ValueError as err:
        raise CLIError(str(err)) from None
    failed = 0
    for check in checks:
        if check.ok:
            tally = comparison_counts(check.records)
            print(f"ok    {check.study}: {len(check.records)} claims ({tally})")
        else:
            failed += 1
            print(f"FAIL  {check.study}:")
            for problem in check.problems:
                print(f"        {problem}")
    print(f"{len(checks) - failed} of {len(checks)} studies' committed comparisons and figures follow from their datasets"
          f" in {args.figures}/")
    return 1 if failed else 0


def comparison_counts(records) -> str:
    from ...common import comparison

    return ", ".join(f"{n} {v}" for v, n in comparison.counts(records).items())


def cmd_gallery(args) -> int:
    from pathlib import Path

    from .. import verify

    _require_file(args.config, "--config")
    try:
        if not args.write:
            print(verify.figure_gallery_markdown(args.config))
            print()
            print(verify.gallery_markdown(args.figures, args.config))
            return 0
        readme = Path(args.write)
        _require_file(str(readme), "--write")
        before = readme.read_text(encoding="utf-8")
        text = verify.update_readme(before, args.figures, args.config)
    except (FileNotFoundError, ValueError) as err:
        raise CLIError(f"gallery: {err}") from None
    if text == before:
        print(f"{readme}: the gallery and the comparison table are current (nothing written)")
        return 0
    tmp = readme.with_name(f".{readme.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, readme)
    print(f"updated the gallery and the comparison table in {readme}")
    return 0


def cmd_docs(args) -> int:
    import time

    from .. import docs

    _require_file(args.config, "--config")
    if not os.path.isdir(args.figures):
        raise CLIError(f"--figures: {args.figures!r} is not a folder")
    try:
        import myst_nb  # noqa: F401 - the toolchain, checked before anything is written
        import sphinx_book_theme  # noqa: F401
    except ImportError as err:
        raise CLIError(f"docs: {err.name} is not installed (make docs installs requirements-docs.txt)") from None
    start = time.perf_counter()
    try:
        out = docs.build(args.out, args.figures, args.config, args.source)
        print(f"wrote {out}/index.html in {time.perf_counter() - start:.0f} s")
        if args.check:
            result = docs.check_site(out)
            print(f"checked in headless Chromium: {result['pages']} pages, {result['figures']} captioned figures, "
                  f"{result['images']} images, {result['links']} links")
            if result["problems"]:
                raise CLIError(f"docs: {len(result['problems'])} problem(s) in {out}; first: {result['problems'][0]}")
    except docs.DocsError as err:
        raise CLIError(str(err)) from None
    return 0


def cmd_publish_notebook(args) -> int:
    from ...common import publish

    _require_file(args.executed, "EXECUTED")
    shown_as = None
    if args.shown_as:
        shown_as = (str(Path(args.destination).parent), args.shown_as)
    print(f"wrote {publish.publish_notebook(args.executed, args.destination, shown_as)}")
    return 0


def cmd_install_outputs(args) -> int:
    from .. import workflow_outputs

    if not os.path.isdir(args.staging):
        raise CLIError(f"STAGING: {args.staging!r} is not a folder (the notebook wrote nothing there)")
    try:
        installed = workflow_outputs.install(args.staging, args.destination, args.names)
    except workflow_outputs.InstallError as err:
        raise CLIError(str(err)) from None
    print(f"installed {len(installed)} files in {args.destination}")
    return 0


def add_parsers(sub) -> None:
    """The ``verify``, ``gallery``, ``docs``, ``publish-notebook`` and ``install-outputs`` commands (``sub``: the
    parser's subcommands)."""
    p = sub.add_parser("verify", help="check every study's paper comparison on the committed datasets")
    p.add_argument("--figures", default="figures", help="folder with one folder per study (default: figures)")
    p.add_argument("--config", default="config/config.yaml", help="workflow config listing the studies")
    p.add_argument("--study", nargs="+", metavar="STUDY", help="only these studies")
    p.add_argument("--write", action="store_true",
                   help="first rewrite each study's comparison.csv from its committed datasets with the study's "
                        "compare (after a change to the verdict rule or to a compare, never to the data), then check")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("gallery", help="the README's gallery and verdict counts (from the registry and every "
                       "study's comparison.csv); without --write, the full figure gallery and comparison table")
    p.add_argument("--figures", default="figures", help="folder with one folder per study (default: figures)")
    p.add_argument("--config", default="config/config.yaml", help="workflow config listing the studies")
    p.add_argument("--write", metavar="README", help="replace the two generated blocks (between their markers) in this file")
    p.set_defaults(func=cmd_gallery)

    p = sub.add_parser("docs", help="the documentation site (Sphinx, myst-nb, book theme) from docs/ and the "
                       "committed outputs")
    p.add_argument("--figures", default="figures", help="folder with one folder per study (default: figures)")
    p.add_argument("--config", default="config/config.yaml", help="workflow config listing the studies")
    p.add_argument("--source", default="docs", help="the hand-written pages and conf.py (default: docs)")
    p.add_argument("--out", default="results/docs/html", help="the site's folder (default: results/docs/html)")
    p.add_argument("--check", action="store_true", help="then load every page in headless Chromium: no broken "
                   "link or image, every figure captioned")
    p.set_defaults(func=cmd_docs)

    p = sub.add_parser("publish-notebook", help="copy an executed notebook without timestamps, for readers")
    p.add_argument("executed", metavar="EXECUTED", help="the notebook papermill executed")
    p.add_argument("destination", metavar="DEST", help="where to write the copy (next to its figures)")
    p.add_argument("--shown-as", metavar="FOLDER",
                   help="the folder the outputs are moved to: replaces DEST's folder (a staging folder) in the copy")
    p.set_defaults(func=cmd_publish_notebook)

    p = sub.add_parser("install-outputs", help="move a study's staged outputs into place once all are there "
                       "(the workflow's last step; nothing moves if one is missing)")
    p.add_argument("staging", metavar="STAGING", help="the folder the notebook wrote into")
    p.add_argument("destination", metavar="DEST", help="the outputs' folder, e.g. figures/<study>")
    p.add_argument("names", metavar="NAME", nargs="+", help="the files to move (every declared output)")
    p.set_defaults(func=cmd_install_outputs)
