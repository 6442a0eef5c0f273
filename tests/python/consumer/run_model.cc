// run_model MODEL.onnx [LIBRARY.so...]: registers opbridge's op library (and any others given),
// feeds every input of the model float32 values 0, 1, 2, ... in its shape (dynamic axes of size
// 2), and prints each output as "<name>: v0 v1 ...". What a C++ application does to run a model
// with opbridge ops, and nothing more.
#include <onnxruntime_cxx_api.h>

#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: run_model MODEL.onnx [LIBRARY.so...]\n";
    return 2;
  }
  try {
    Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "run_model");
    Ort::SessionOptions options;
    options.RegisterCustomOpsLibrary(OPBRIDGE_ORT_LIBRARY);
    for (int i = 2; i < argc; ++i) options.RegisterCustomOpsLibrary(argv[i]);
    Ort::Session session(env, argv[1], options);
    std::cout << "onnxruntime " << Ort::GetVersionString() << "\n";

    Ort::AllocatorWithDefaultOptions alloc;
    auto memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    std::vector<std::string> in_names, out_names;
    std::vector<std::vector<float>> data;
    std::vector<Ort::Value> inputs;
    for (size_t i = 0; i < session.GetInputCount(); ++i) {
      in_names.push_back(session.GetInputNameAllocated(i, alloc).get());
      std::vector<int64_t> shape = session.GetInputTypeInfo(i).GetTensorTypeAndShapeInfo().GetShape();
      size_t n = 1;
      for (int64_t& d : shape) n *= static_cast<size_t>(d = d < 0 ? 2 : d);
      data.emplace_back(n);
      for (size_t k = 0; k < n; ++k) data.back()[k] = static_cast<float>(k);
      inputs.push_back(Ort::Value::CreateTensor<float>(memory, data.back().data(), n, shape.data(), shape.size()));
    }
    for (size_t i = 0; i < session.GetOutputCount(); ++i) out_names.push_back(session.GetOutputNameAllocated(i, alloc).get());
    std::vector<const char*> in_c, out_c;
    for (auto& s : in_names) in_c.push_back(s.c_str());
    for (auto& s : out_names) out_c.push_back(s.c_str());
    auto outputs = session.Run(Ort::RunOptions{nullptr}, in_c.data(), inputs.data(), inputs.size(), out_c.data(), out_c.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      const float* v = outputs[i].GetTensorData<float>();
      std::cout << out_names[i] << ":";
      for (size_t k = 0; k < outputs[i].GetTensorTypeAndShapeInfo().GetElementCount(); ++k) std::cout << " " << v[k];
      std::cout << "\n";
    }
  } catch (const Ort::Exception& e) {
    std::cerr << "run_model: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
