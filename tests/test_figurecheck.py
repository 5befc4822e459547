"""The figure check behind `trainscale verify`: a deliberately misleading figure is caught, with one line naming
what, and the figures the studies draw from their committed datasets pass it."""

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from trainscale.common import figurecheck, plotting
from trainscale.interface import verify  # noqa: E402
from trainscale.studies import registry  # noqa: E402
from conftest import REPO_ROOT  # noqa: E402

STEPS = np.arange(10.0)


@pytest.fixture(autouse=True)
def _style():
    """The project's style (constrained layout: a small figure keeps its labels inside)."""
    with matplotlib.rc_context(plotting.STYLE):
        yield
    plt.close("all")

LOSS = 0.2 * np.exp(-STEPS / 3) + 0.01


def _fig():
    fig, ax = plt.subplots(figsize=(4, 3))
    return fig, ax


def test_an_honest_figure_has_no_problem():
    fig, ax = _fig()
    ax.semilogy(STEPS, LOSS, label="synchronous")
    ax.semilogy(STEPS, 1.1 * LOSS, "--", label="gear")
    ax.set(xlabel="step", ylabel="loss")
    ax.legend()
    assert figurecheck.figure_problems(fig) == []


def test_a_diverged_value_is_caught():
    fig, ax = _fig()
    ax.semilogy(STEPS, np.append(LOSS[:-1], 7.7e304), label="asynchronous")
    ax.legend()
    problems = figurecheck.figure_problems(fig, "convergence.png")
    assert any("'asynchronous' plots 1 diverged value(s) (e.g. 7.7e+304)" in p for p in problems), problems


def test_a_log_axis_far_below_the_data_is_caught():
    fig, ax = _fig()
    ax.semilogy(STEPS, LOSS)
    ax.set_ylim(1e-13, 1)
    problems = figurecheck.figure_problems(fig, "f.png")
    assert problems == ["f.png panel 1: y-axis shows 1e-13..1, more than 1 decade(s) beyond the data 0.02..0.21"]


def test_a_bar_axis_cutting_the_bars_and_an_inverted_axis_are_caught():
    fig, ax = _fig()
    ax.bar([0, 1], [0.70, 0.66])
    ax.set_ylim(0.5, None)
    fig2, ax2 = _fig()
    ax2.plot(STEPS, LOSS)
    ax2.set_ylim(0.25, 0)
    assert figurecheck.figure_problems(fig, "bars.png") == [
        "bars.png panel 1: y-axis shows 0.5..0.735 but the data run 0..0.7 (data cut off)"]
    assert figurecheck.figure_problems(fig2, "inv.png") == ["inv.png panel 1: y-axis runs from 0.25 down to 0 (inverted)"]
    figurecheck.invert_on_purpose(ax2, "y")
    figurecheck.invert_on_purpose(ax2, "y")  # back to rising: no problem either way
    assert figurecheck.figure_problems(fig2) == []


def test_a_legend_naming_what_a_panel_does_not_draw_is_caught():
    fig, axes = plt.subplots(1, 2, figsize=(6, 3))
    axes[0].plot(STEPS, LOSS, label="asynchronous tau=15")
    axes[1].plot(STEPS, LOSS, label="asynchronous tau=1")
    axes[1].legend()
    problems = figurecheck.figure_problems(fig, "equal_time.png")
    assert problems == ["equal_time.png panel 1: series 'asynchronous tau=15' is drawn but no legend covering it "
                        "names it (label it, or mark it a guide)"]


def test_an_unlabelled_line_and_an_empty_entry_are_caught_a_guide_is_not():
    fig, ax = _fig()
    ax.plot(STEPS, LOSS, label="ratio")
    ax.plot(STEPS, np.full(10, np.nan), label="never drawn")
    line = ax.axvline(3.0, ls=":")
    ax.legend()
    problems = figurecheck.figure_problems(fig, "sweeps.png")
    assert "sweeps.png panel 1: series 'never drawn' draws nothing (every value is NaN)" in problems
    assert ("sweeps.png panel 1: an unlabelled Line2D is drawn but no legend covering it names it (label it, or "
            "mark it a guide)") in problems
    figurecheck.guide(line)
    assert figurecheck.figure_problems(fig, "sweeps.png") == [
        "sweeps.png panel 1: series 'never drawn' draws nothing (every value is NaN)"]


def test_two_legend_entries_of_one_colour_are_caught():
    fig, ax = _fig()
    ax.scatter([1, 2], [1, 2], color="C1", label="nemo-hopper")
    ax.scatter([1.5, 2.5], [1.4, 2.6], color="C1", label="vtrain-single")
    ax.legend()
    assert figurecheck.figure_problems(fig, "parity.png") == [
        "parity.png: legend entries 'nemo-hopper' and 'vtrain-single' look alike (colour #e69f00)"]


def test_a_clipped_label_is_caught():
    fig, ax = _fig()
    ax.plot(STEPS, LOSS)
    ax.set_ylabel("one decode step (batch 1, 1024 cached tokens) on one dgx-a100-80gb GPU [s]")
    problems = figurecheck.figure_problems(fig, "inference.png")
    assert problems == ["inference.png: text 'one decode step (batch 1, 1024 cached tokens) on one dgx-a100-80gb "
                        "GPU [s]' runs outside the figure (clipped)"]


STUDIES_WITH_FIGURES = [s for s in verify.study_names(REPO_ROOT / "config" / "config.yaml")
                        if registry.load(s).figures]


@pytest.mark.slow  # 79 figures, ~70 s on one core: make verify checks the same (and the bytes); CI runs it
@pytest.mark.parametrize("study", STUDIES_WITH_FIGURES)
def test_the_figures_a_study_draws_from_its_committed_datasets_pass_the_check(study):
    """Drawn from the committed full datasets: no problem (the committed PNG's bytes are verify's concern)."""
    problems = [p for p in verify.check_figures(study, REPO_ROOT / "figures") if "is not the figure" not in p]
    assert problems == []


def test_verify_reports_a_committed_png_its_dataset_does_not_draw(tmp_path):
    import shutil

    folder = tmp_path / "pruning"
    shutil.copytree(REPO_ROOT / "figures" / "pruning", folder)
    draw = registry.load("pruning").figures["inference.png"]
    with matplotlib.rc_context(plotting.STYLE):
        plotting.save_and_show(draw(folder), folder / "inference.png")
    assert verify.check_figures("pruning", tmp_path) == []
    png = folder / "inference.png"
    drawn = png.read_bytes()
    png.write_bytes(drawn + b"\0")
    assert verify.check_figures("pruning", tmp_path) == [
        f"{png} is not the figure its committed datasets draw (bytes after the PNG's end, or no end; rerun the "
        f"study: make figures)"]
    from PIL import Image

    with Image.open(io.BytesIO(drawn)) as image:  # one pixel of another colour, saved as save_figure saves
        pixels = image.copy()
    pixels.putpixel((10, 10), (255, 0, 0, 255) if pixels.getpixel((10, 10)) != (255, 0, 0, 255) else (0, 0, 0, 255))
    pixels.save(png, dpi=(150, 150))
    assert verify.check_figures("pruning", tmp_path) == [
        f"{png} is not the figure its committed datasets draw (other pixels; rerun the study: make figures)"]
    pixels.resize((pixels.width // 2, pixels.height // 2)).save(png, dpi=(150, 150))
    assert verify.check_figures("pruning", tmp_path) == [
        f"{png} is not the figure its committed datasets draw ({pixels.width // 2}x{pixels.height // 2} pixels, "
        f"drawn {pixels.width}x{pixels.height}; rerun the study: make figures)"]
    png.write_bytes(drawn)
    with Image.open(io.BytesIO(drawn)) as image:
        image.save(png, dpi=(150, 150), pnginfo=_text_chunk("Software", "matplotlib"))
    assert verify.check_figures("pruning", tmp_path) == [
        f"{png} is not the figure its committed datasets draw (metadata ['Software'] that save_figure does not "
        f"write; rerun the study: make figures)"]


def _text_chunk(key, value):
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text(key, value)
    return info


def test_a_constant_up_to_rounding_may_keep_matplotlibs_padding():
    """A ratio of 1 that is 1 - 1e-16 in one seed is a constant: matplotlib pads it by 5%, which is no problem;
    a real spread with the same padding still is."""
    fig, ax = _fig()
    ax.plot([1, 2, 3], [1.0, 1.0 - 1.1e-16, 1.0], "o-", label="GA / PETALS'")
    ax.legend()
    assert figurecheck.figure_problems(fig, "sweeps.png") == []
    fig2, ax2 = _fig()
    ax2.plot([1, 2, 3], [1.0, 1.0 - 1e-3, 1.0])
    ax2.set_ylim(0.9, 1.1)
    assert figurecheck.figure_problems(fig2, "f.png") == [
        "f.png panel 1: y-axis shows 0.9..1.1, more than 1 of the data's span beyond the data 0.999..1"]


def test_verify_lays_a_figure_out_once_and_draws_the_pixels_savefig_draws():
    """verify's one-pass drawing (the layout engine run alone, then detached) gives savefig's two-pass pixels."""
    folder = REPO_ROOT / "figures" / "heterogeneous-cluster"
    for name, draw in registry.load("heterogeneous-cluster").figures.items():
        with matplotlib.rc_context(plotting.STYLE):
            two_passes, one_pass = draw(folder), draw(folder)
            assert two_passes.get_layout_engine() is not None, name
            try:
                assert verify._laid_out_once(one_pass) == figurecheck.render_rgba(two_passes), name
            finally:
                plt.close(two_passes)
                plt.close(one_pass)
