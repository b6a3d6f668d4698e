"""cconv's docstrings are plain text (ASCII formulas such as ``||x - C(x)||^2 <= (1 - k/d)||x||^2``),
not reStructuredText: render each one as a literal block so that autodoc shows it as written and a
``*`` or a ``|`` in a formula is never parsed as markup (which would be a warning, an error under -W)."""


def _literal(app, what, name, obj, options, lines):
    if not lines or not any(line.strip() for line in lines):
        return
    body = ["    " + line if line.strip() else "" for line in lines]
    lines[:] = ["::", "", *body, ""]


def setup(app):
    app.connect("autodoc-process-docstring", _literal)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
