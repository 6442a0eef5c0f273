"""What mmdet 3.x's own code imports and its wheel lacks, for installed mmdet (`install("mmdet")`
adds these modules to it and leaves the rest alone): `mmdet.core.export`, which its box coders
import while an ONNX export traces them (a module of mmdet 2.x)."""
