"""tkc: ahead-of-time compiler for TileLang GPU kernels.

The pipeline has one module per stage: ``spec`` (YAML to frozen dataclasses),
``render`` (jinja2 templates to TileLang modules), ``lower`` (TileLang to CUDA
source plus the launch contract), ``compile`` (nvcc to cubins), ``package``
(per-arch Python package and wheel). ``build`` runs them with a cache.
"""

__version__ = "0.1.0"
