"""transformers' module-level `multi_scale_deformable_attention(value, value_spatial_shapes,
sampling_locations, attention_weights)` (Mask2Former's and OneFormer's pixel decoders), and
mmcv's `multi_scale_deformable_attn_pytorch` of the same signature (what mmcv's
MultiScaleDeformableAttention runs on a CPU: Deformable DETR, DINO in mmdet), on
opbridge::multi_scale_deformable_attention.

The op's definition declares the rules for the modules and Functions that pass the levels' start
indices (transformers' MultiScaleDeformableAttention.forward, mmcv's Function). This function
takes none, and OpBuilder::replaces binds a target's parameters to the op's inputs one to one, so
it cannot derive one; the rule is added here, from Python, with `level_start_index` computed
from the shapes. The shapes come as a list of (height, width) pairs read from the feature maps'
sizes: they are stacked into a tensor without going through Python numbers, so that neither
exporter bakes them (the grid_sample path they replace reshapes by them).

The pixel decoders' attention modules (Mask2FormerPixelDecoderEncoderMultiscaleDeformableAttention,
OneFormer's twin) divide the sampling offsets by the levels' (width, height), which Mask2Former
builds with torch.tensor from those sizes: a constant in a TorchScript trace, so an export made at
one image size samples wrongly at another. Their forwards are substituted too, with the same
projections, softmax and sampling locations, the divisor stacked from the traced sizes and the
sampling on the fused op. The dynamo exporter still cannot keep the image size dynamic: the pixel
decoder's own forward turns the sizes into a tensor with torch.as_tensor (modeling_mask2former.py,
`spatial_shapes = torch.as_tensor(spatial_shapes_list, ...)`), which torch.export specializes.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()  # torch.ops.opbridge.* exist from here on

__all__ = ["MODULE_TARGETS", "TARGETS", "multi_scale_deformable_attention", "spatial_shapes"]

# Where transformers defines the function (each module has its own copy), and the attention
# modules whose forwards call it.
_MODELS = {"mask2former": "Mask2Former", "oneformer": "OneFormer"}
TARGETS = tuple(f"transformers.models.{m}.modeling_{m}.multi_scale_deformable_attention" for m in _MODELS) + \
    ("mmcv.ops.multi_scale_deform_attn.multi_scale_deformable_attn_pytorch",)
MODULE_TARGETS = tuple(f"transformers.models.{m}.modeling_{m}.{c}PixelDecoderEncoderMultiscaleDeformableAttention"
                       f".forward" for m, c in _MODELS.items())


def _size(v, device: torch.device) -> Tensor:
    """One height or width as a 0-d int64 tensor: a traced size (TorchScript exporter), a SymInt
    (torch.export) or an int, kept symbolic where it is one."""
    if isinstance(v, Tensor):
        return v.to(device=device, dtype=torch.long).reshape(())
    return torch.scalar_tensor(v, dtype=torch.long, device=device) if isinstance(v, torch.SymInt) else \
        torch.tensor(int(v), dtype=torch.long, device=device)


def spatial_shapes(shapes: Union[Tensor, Sequence], device: torch.device) -> Tensor:
    """(L, 2) int64 (height, width) per level, from a tensor or a list of pairs."""
    if isinstance(shapes, Tensor):
        return shapes.to(device=device, dtype=torch.long)
    return torch.stack([torch.stack([_size(h, device), _size(w, device)]) for h, w in shapes])


def multi_scale_deformable_attention(value: Tensor, value_spatial_shapes: Union[Tensor, Sequence],
                                     sampling_locations: Tensor, attention_weights: Tensor) -> Tensor:
    """transformers' multi_scale_deformable_attention (the grid_sample path): (B, Q, H*D), on one
    opbridge::multi_scale_deformable_attention; level l starts at the sum of the levels' areas
    before it."""
    shapes = spatial_shapes(value_spatial_shapes, value.device)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    return torch.ops.opbridge.multi_scale_deformable_attention(value, shapes, starts, sampling_locations,
                                                                attention_weights)


def _attend(module, hidden_states: Tensor, attention_mask: Optional[Tensor], encoder_hidden_states: Tensor,
            position_embeddings: Optional[Tensor], reference_points: Tensor, shapes: Tensor) -> tuple[Tensor, Tensor]:
    """The pixel decoder attention's forward (transformers 5.x) with `shapes` (L, 2) the levels'
    (height, width) as a tensor: (output, attention_weights)."""
    if position_embeddings is not None:
        hidden_states = hidden_states + position_embeddings
    batch_size, num_queries, _ = hidden_states.shape
    batch_size, sequence_length, _ = encoder_hidden_states.shape
    heads, levels, points = module.n_heads, module.n_levels, module.n_points
    value = module.value_proj(encoder_hidden_states)
    if attention_mask is not None:
        value = value.masked_fill(attention_mask[..., None], float(0))
    value = value.view(batch_size, sequence_length, heads, module.d_model // heads)
    offsets = module.sampling_offsets(hidden_states).view(batch_size, num_queries, heads, levels, points, 2)
    weights = module.attention_weights(hidden_states).view(batch_size, num_queries, heads, levels * points)
    weights = torch.nn.functional.softmax(weights, -1).view(batch_size, num_queries, heads, levels, points)
    if reference_points.shape[-1] == 2:
        normalizer = torch.stack([shapes[:, 1], shapes[:, 0]], -1)  # (width, height), as the model's tensor
        locations = reference_points[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
    elif reference_points.shape[-1] == 4:
        locations = (reference_points[:, :, None, :, None, :2]
                     + offsets / points * reference_points[:, :, None, :, None, 2:] * 0.5)
    else:
        raise ValueError(f"Last dim of reference_points must be 2 or 4, but got {reference_points.shape[-1]}")
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    out = torch.ops.opbridge.multi_scale_deformable_attention(value, shapes, starts, locations, weights)
    return module.output_proj(out), weights


def _mask2former_forward(self, hidden_states: Tensor, attention_mask: Optional[Tensor] = None,
                         encoder_hidden_states=None, encoder_attention_mask=None,
                         position_embeddings: Optional[Tensor] = None, reference_points=None,
                         spatial_shapes_list=None, level_start_index=None, output_attentions: bool = False):
    """Mask2FormerPixelDecoderEncoderMultiscaleDeformableAttention.forward on the fused op."""
    shapes = spatial_shapes(spatial_shapes_list, hidden_states.device)
    return _attend(self, hidden_states, attention_mask, encoder_hidden_states, position_embeddings, reference_points,
                   shapes)


def _oneformer_forward(self, hidden_states: Tensor, attention_mask: Optional[Tensor] = None,
                       encoder_hidden_states=None, encoder_attention_mask=None,
                       position_embeddings: Optional[Tensor] = None, reference_points=None, spatial_shapes=None,
                       level_start_index=None, output_attentions: bool = False, spatial_shapes_list=None):
    """OneFormerPixelDecoderEncoderMultiscaleDeformableAttention.forward on the fused op (the list
    of sizes where given: the tensor is built from it with torch.as_tensor, a constant in a trace)."""
    shapes = spatial_shapes(spatial_shapes_list if spatial_shapes_list is not None else spatial_shapes,
                            hidden_states.device)
    return _attend(self, hidden_states, attention_mask, encoder_hidden_states, position_embeddings, reference_points,
                   shapes)


for _target in TARGETS:
    opbridge.substitute(_target, multi_scale_deformable_attention,
                        doc="opbridge.compat.deformable_attention: opbridge::multi_scale_deformable_attention, "
                            "level_start_index from the shapes")
for _target, _forward in zip(MODULE_TARGETS, (_mask2former_forward, _oneformer_forward)):
    opbridge.substitute(_target, _forward,
                        doc="opbridge.compat.deformable_attention: the pixel decoder's attention on "
                            "opbridge::multi_scale_deformable_attention, the offsets' divisor from the traced sizes")
