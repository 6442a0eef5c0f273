"""The runtime wing: ONNX Runtime and OpenVINO with opbridge's libraries — sessions (session,
openvino), what the installed runtime can run (inspect), and a runtime against PyTorch eager
(verify). Built on the library wing; only verify imports PyTorch."""
