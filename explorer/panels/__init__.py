"""The explorer's panels: each lays out its components inside the enclosing
``gr.Blocks`` and wires their events to a ``Backend``
(``engine_adapter.service.backend``); handlers return ``{component: value}``
dicts. Figures and text come from ``explorer.views``.
"""
