# The conformance results plugin archives every pytest run under results/.
pytest_plugins = ["conformance.plugin"]
