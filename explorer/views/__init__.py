"""Pure builders of what the explorer shows: figures, Markdown and values from
engine-neutral records (``engine_adapter.records``) or a ``Backend``'s answers.
No Gradio here: the panels (``explorer.panels``) wire these to components.
"""
