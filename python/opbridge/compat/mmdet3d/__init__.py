"""Substitution rules for mmdet3d's own copies of mmcv's Python ops (see voxelize)."""
