"""xfam_lib: the library of *The Transformer Family — an executable textbook*.

One module per topic; every algorithm has a naive reference and, where one exists, an
efficient form tested to agree with it. See the book's conventions page for layouts and masks.
"""
__version__ = "0.6.0"   # released as the git tag "v" + __version__ (`repository: release:` in _config.yml)
