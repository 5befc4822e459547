"""A static page of the Explorer's widget tree for the browser checks of tests/test_explore_screens.py.

Rendering the live widget needs a Jupyter server and ipywidgets' JavaScript (fetched from a CDN, so not offline);
instead every widget of ``Explorer.widget`` becomes an element with the same layout properties (flex, widths,
min-widths, wrapping) under JupyterLab's widget CSS values, and the two charts and the best-plans table are the
real plotly figures and HTML. What it checks is the widget's own layout at a given notebook width."""

import html

# JupyterLab / ipywidgets 8 values: 13px UI font, 28px inline height, 2px margins, buttons padded 10px each side,
# border-box sizing, the label 80px unless description_width says otherwise
CSS = """
body { margin: 0; font-family: system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; font-size: 13px;
       color: rgba(0,0,0,.87); }
* { box-sizing: border-box; }
.cell { width: 100%; padding: 0; }
.vbox { display: flex; flex-direction: column; }
.hbox { display: flex; flex-direction: row; }
.w { display: flex; align-items: baseline; margin: 2px; height: 28px; line-height: 28px; }
.label { width: 80px; text-align: right; padding-right: 8px; white-space: nowrap; overflow: hidden;
         text-overflow: ellipsis; flex-shrink: 0; }
.control { flex: 1 1 auto; min-width: 0; border: 1px solid #bdbdbd; height: 28px; padding: 0 6px;
           overflow: hidden; white-space: nowrap; }
.slider { flex: 1 1 auto; min-width: 0; height: 4px; background: #bdbdbd; margin: 0 10px; align-self: center; }
.readout { width: 44px; flex-shrink: 0; text-align: center; }
.jupyter-button { padding: 0 10px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis;
                  text-align: center; height: 28px; line-height: 28px; background: #eeeeee; border: none;
                  margin: 0 2px; font-size: 13px; font-family: inherit; display: inline-block;
                  flex-shrink: 0; }
.jupyter-button.on { background: #bdbdbd; }
.html { margin: 2px; }
.output { overflow: auto; }
"""


def style_of(layout) -> str:
    css = []
    for attr, prop in (("width", "width"), ("min_width", "min-width"), ("max_width", "max-width"),
                       ("flex", "flex"), ("flex_flow", "flex-flow"), ("height", "height"),
                       ("overflow", "overflow"), ("justify_content", "justify-content"), ("margin", "margin"),
                       ("padding", "padding"), ("align_items", "align-items"), ("gap", "gap")):
        value = getattr(layout, attr, None)
        if value:
            css.append(f"{prop}: {value}")
    return "; ".join(css)


def label(widget) -> str:
    width = getattr(widget.style, "description_width", "") or "80px"
    if not widget.description:
        return ""
    return f"<span class='label' style='width:{width}'>{html.escape(widget.description)}</span>"


def render(widget, outputs) -> str:
    import ipywidgets as w

    s = style_of(widget.layout)
    if isinstance(widget, w.Box):
        cls = "hbox" if isinstance(widget, w.HBox) else "vbox"
        inner = "".join(render(child, outputs) for child in widget.children)
        return f"<div class='{cls}' style='{s}'>{inner}</div>"
    if isinstance(widget, w.Output):
        return f"<div class='output' style='{s}'>{outputs.get(id(widget), '')}</div>"
    if isinstance(widget, w.HTML):
        return f"<div class='html' style='{s}'>{widget.value}</div>"
    if isinstance(widget, w.ToggleButtons):
        bw = widget.style.button_width or "auto"
        buttons = "".join(f"<button class='jupyter-button{' on' if v == widget.value else ''}' "
                          f"style='width:{bw}'>{html.escape(str(lab))}</button>"
                          for lab, v in zip(widget._options_labels, widget._options_values))
        return f"<div class='w' style='{s}'>{label(widget)}<div style='display:flex'>{buttons}</div></div>"
    if isinstance(widget, w.Checkbox):
        return (f"<div class='w' style='{s}'><input type='checkbox' {'checked' if widget.value else ''}>"
                f"<span style='padding-left:4px; white-space:nowrap'>{html.escape(widget.description)}</span></div>")
    if isinstance(widget, w.Button):
        return f"<button class='jupyter-button' style='{s or 'width:148px'}; margin:2px'>{html.escape(widget.description)}</button>"
    if isinstance(widget, (w.SelectionSlider,)):
        return (f"<div class='w' style='{s}'>{label(widget)}<div class='slider'></div>"
                f"<span class='readout'>{html.escape(str(widget.value))}</span></div>")
    if isinstance(widget, (w.Dropdown, w.BoundedIntText, w.IntText)):
        return (f"<div class='w' style='{s}'>{label(widget)}<div class='control'>"
                f"{html.escape(str(widget.value))}</div></div>")
    return f"<div>[{type(widget).__name__}]</div>"


def plotly_div(fig, div_id) -> str:
    """A div plotted once the whole page is parsed (as in JupyterLab, where every output box exists before
    plotly.js has loaded), so each chart takes the width its flex box gets beside its sibling."""
    return (f"<div id='{div_id}'></div><script>window.addEventListener('load', () => Plotly.newPlot("
            f"'{div_id}', ...(f => [f.data, f.layout])({fig.to_json()}), {{responsive: true}}));</script>")


def page(body: str, title: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<script src='plotly.min.js'></script><style>{CSS}</style></head><body><div class='cell'>{body}</div>"
            "</body></html>")



MEASURE = """<pre id='measure'></pre><script>
window.addEventListener('load', () => setTimeout(() => {
  const inner = window.innerWidth, out = {page_overflow_px: document.documentElement.scrollWidth - inner, charts: {}};
  for (const id of ['time', 'memory']) {
    const div = document.getElementById(id), r = div.getBoundingClientRect();
    const bars = [...div.querySelectorAll('.point path')].map(p => p.getBoundingClientRect())
                   .filter(b => b.width > 0);
    out.charts[id] = {right_px: r.right, width_px: r.width, bars: bars.length,
                      bars_cut: bars.filter(b => b.right > Math.min(r.right, inner) + 0.5).length};
  }
  const table = document.querySelector('table');
  out.table_overflow_px = table ? table.getBoundingClientRect().right - inner : null;
  const ellipsed = [...document.querySelectorAll('.jupyter-button, .label')]
                     .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent);
  out.cut_labels = ellipsed;
  document.getElementById('measure').textContent = JSON.stringify(out);
}, 3000));
</script>"""


def explorer_page(ex) -> str:
    """The page of an :class:`trainscale.interface.explore.Explorer` (its last search shown), with the measurement script."""
    outputs = {id(ex.time_out): plotly_div(ex.time_figure, "time"),
               id(ex.memory_out): plotly_div(ex.memory_figure, "memory")}
    return page(render(ex.widget, outputs) + MEASURE, "explorer")
