# Sphinx configuration of the API reference (`make docs`: built with warnings as errors).
# The reference is generated from the docstrings of the built package (python/ on the path).
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(__file__, "..", "..", "..", "python")))

project = "sparsejit"
extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_inherit_docstrings = False  # torch.nn.Module's own docstrings are not ours
nitpicky = False
html_theme = "alabaster"
exclude_patterns = ["_build"]
