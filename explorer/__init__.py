"""The explorer's UI (Gradio 6): ``explorer.page.build_page`` lays out the panels
(``explorer.panels``) that draw pure views (``explorer.views``) of what a
``Backend`` (``engine_adapter.service.backend``) reports. No vLLM here.
"""
