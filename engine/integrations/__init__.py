"""Optional integrations with other frameworks. Each needs its extra and is imported on its own
(``import engine.integrations.langchain`` needs ``pip install 'histlog[langchain]'``); importing
``engine`` never imports them."""
