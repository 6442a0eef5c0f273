// A Python-free consumer: the ONNX Runtime C++ API loads a model exported by opbridge (the demo
// model, by both exporters), registers libopbridge_ort.so, runs it at several batch sizes and
// compares with a naive loop of the same math.
#include <gtest/gtest.h>
#include <onnxruntime_cxx_api.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

constexpr int64_t kFeatures = 8;
constexpr float kAlpha = 0.5f;

struct Outputs {
  std::vector<float> out0, out1;
  std::vector<int64_t> shape0, shape1;
};

Outputs run_model(const std::string& path, const std::vector<float>& x, const std::vector<float>& y, int64_t batch) {
  static Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "opbridge-consumer");
  Ort::SessionOptions options;
  options.SetIntraOpNumThreads(2);
  options.RegisterCustomOpsLibrary(OPBRIDGE_ORT_LIBRARY);
  Ort::Session session(env, path.c_str(), options);

  auto mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<int64_t> shape{batch, kFeatures};
  std::vector<Ort::Value> inputs;
  inputs.push_back(Ort::Value::CreateTensor<float>(mem, const_cast<float*>(x.data()), x.size(), shape.data(), shape.size()));
  inputs.push_back(Ort::Value::CreateTensor<float>(mem, const_cast<float*>(y.data()), y.size(), shape.data(), shape.size()));
  const char* in_names[] = {"x", "y"};
  const char* out_names[] = {"out0", "out1"};
  auto out = session.Run(Ort::RunOptions{nullptr}, in_names, inputs.data(), 2, out_names, 2);

  Outputs r;
  for (int k = 0; k < 2; ++k) {
    auto info = out[k].GetTensorTypeAndShapeInfo();
    const float* p = out[k].GetTensorData<float>();
    std::vector<float> v(p, p + info.GetElementCount());
    (k == 0 ? r.out0 : r.out1) = v;
    (k == 0 ? r.shape0 : r.shape1) = info.GetShape();
  }
  return r;
}

class OrtConsumer : public ::testing::TestWithParam<std::string> {};

TEST_P(OrtConsumer, MatchesNaiveLoopAtSeveralBatchSizes) {
  const std::string path = std::string(OPBRIDGE_MODEL_DIR) + "/demo_" + GetParam() + ".onnx";
  for (int64_t batch : {1, 3, 16}) {
    std::vector<float> x(batch * kFeatures), y(batch * kFeatures);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = std::sin(0.37f * i);
      y[i] = std::cos(0.11f * i) - 0.25f;
    }
    Outputs r = run_model(path, x, y, batch);
    ASSERT_EQ(r.shape0, (std::vector<int64_t>{batch, kFeatures}));
    ASSERT_EQ(r.shape1, (std::vector<int64_t>{batch, kFeatures}));
    for (size_t i = 0; i < x.size(); ++i) {
      const float s = 2.0f * x[i] + y[i];
      EXPECT_NEAR(r.out0[i], std::asinh(s * kAlpha - y[i]), 1e-6f) << "batch " << batch << " element " << i;
      EXPECT_EQ(r.out1[i], y[i] * kAlpha - s) << "batch " << batch << " element " << i;
    }
  }
}

TEST(OrtConsumerErrors, BadInputShapeIsAFailedStatusNamingTheOp) {
  const std::string path = std::string(OPBRIDGE_MODEL_DIR) + "/demo_dynamo.onnx";
  std::vector<float> x(2 * kFeatures, 1.f), y(3 * kFeatures, 1.f);
  static Ort::Env env(ORT_LOGGING_LEVEL_FATAL, "opbridge-consumer-errors");
  Ort::SessionOptions options;
  options.RegisterCustomOpsLibrary(OPBRIDGE_ORT_LIBRARY);
  Ort::Session session(env, path.c_str(), options);
  auto mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<int64_t> sx{2, kFeatures}, sy{3, kFeatures};
  std::vector<Ort::Value> inputs;
  inputs.push_back(Ort::Value::CreateTensor<float>(mem, x.data(), x.size(), sx.data(), sx.size()));
  inputs.push_back(Ort::Value::CreateTensor<float>(mem, y.data(), y.size(), sy.data(), sy.size()));
  const char* in_names[] = {"x", "y"};
  const char* out_names[] = {"out0", "out1"};
  try {
    session.Run(Ort::RunOptions{nullptr}, in_names, inputs.data(), 2, out_names, 2);
    FAIL() << "mismatched batch sizes ran";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find("opbridge::my_add"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot be broadcast"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(BothExporters, OrtConsumer, ::testing::Values("dynamo", "torchscript"));

}  // namespace

// ---- loading into an older ONNX Runtime -------------------------------------------------------
#include <dlfcn.h>

namespace {

// Pretends to be ONNX Runtime 1.20: it refuses API versions above 20 and delegates the rest to
// the real runtime (whose old API tables are still served).
const OrtApi* OldGetApi(uint32_t version) noexcept { return version > 20 ? nullptr : OrtGetApiBase()->GetApi(version); }
const char* OldVersion() noexcept { return "1.20.0"; }

TEST(OrtLibraryLoading, OlderRuntimeGetsAMessageNamingBothVersions) {
  void* handle = dlopen(OPBRIDGE_ORT_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  using Register = OrtStatus* (*)(OrtSessionOptions*, const OrtApiBase*);
  auto reg = reinterpret_cast<Register>(dlsym(handle, "RegisterCustomOps"));
  ASSERT_NE(reg, nullptr);
  OrtApiBase old{&OldGetApi, &OldVersion};
  OrtStatus* status = reg(nullptr, &old);
  ASSERT_NE(status, nullptr);
  const OrtApi* api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  std::string msg = api->GetErrorMessage(status);
  api->ReleaseStatus(status);
  EXPECT_NE(msg.find("1.29"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1.20.0"), std::string::npos) << msg;
}

TEST(OrtLibraryLoading, ExportsOnlyRegisterCustomOps) {
  void* handle = dlopen(OPBRIDGE_ORT_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  EXPECT_NE(dlsym(handle, "RegisterCustomOps"), nullptr);
  EXPECT_EQ(dlsym(handle, "_ZN8opbridge8registryEv"), nullptr);  // opbridge::registry()
}

}  // namespace
