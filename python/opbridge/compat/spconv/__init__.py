"""spconv 2.x (`import spconv.pytorch as spconv`) on opbridge's sparse ops, for a machine where spconv
itself does not install: see opbridge.compat.spconv.pytorch. `rules` holds the forwards that both
these modules and the substitution rules for the real spconv's modules run."""

__version__ = "2.3.8"  # the spconv API these modules follow (mmdet3d checks `spconv.__version__ >= '2.0.0'`)
SPCONV_VERSION_NUMBERS = (2, 3, 8)
