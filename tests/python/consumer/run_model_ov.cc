// run_model_ov MODEL.onnx [LIBRARY_ov.so...]: run_model's counterpart in OpenVINO. Adds the OpenVINO
// side of opbridge's op library (and of any others given: each maps the nodes of its own ONNX
// domain) to an ov::Core, feeds every input float32 values 0, 1, 2, ... in its shape (dynamic axes
// of size 2), and prints each output as "<name>: v0 v1 ...". What a C++ application does to run a
// model with opbridge ops in OpenVINO, and nothing more.
#include <openvino/openvino.hpp>

#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: run_model_ov MODEL.onnx [LIBRARY_ov.so...]\n";
    return 2;
  }
  try {
    ov::Core core;
    // Before read_model: the ONNX frontend converts the libraries' nodes while it reads the model.
    core.add_extension(OPBRIDGE_OV_LIBRARY);
    for (int i = 2; i < argc; ++i) core.add_extension(argv[i]);
    std::shared_ptr<ov::Model> model = core.read_model(argv[1]);
    // float32 as PyTorch computes it (the CPU plugin's default on CPUs with bfloat16 is bfloat16).
    ov::CompiledModel compiled = core.compile_model(model, "CPU", ov::hint::inference_precision(ov::element::f32));
    ov::InferRequest request = compiled.create_infer_request();
    std::cout << "openvino " << ov::get_openvino_version().buildNumber << "\n";

    for (size_t i = 0; i < compiled.inputs().size(); ++i) {
      ov::PartialShape partial = compiled.input(i).get_partial_shape();
      ov::Shape shape;
      for (const ov::Dimension& d : partial) shape.push_back(d.is_static() ? d.get_length() : 2);
      ov::Tensor tensor(ov::element::f32, shape);
      float* p = tensor.data<float>();
      for (size_t k = 0; k < tensor.get_size(); ++k) p[k] = static_cast<float>(k);
      request.set_input_tensor(i, tensor);
    }
    request.infer();
    for (size_t i = 0; i < compiled.outputs().size(); ++i) {
      ov::Tensor out = request.get_output_tensor(i);
      const float* v = out.data<const float>();
      std::cout << compiled.output(i).get_any_name() << ":";
      for (size_t k = 0; k < out.get_size(); ++k) std::cout << " " << v[k];
      std::cout << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "run_model_ov: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
