"""mmdet.core: only its export module (see opbridge.compat.mmdet)."""
