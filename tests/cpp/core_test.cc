// Tests of the core: spec validation, shape inference, dtype and attribute resolution, the
// manifest. Op kernels are tested next to their definitions (ops/<op>/<op>_test.cc).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <random>
#include <thread>

#include <opbridge/testing/kernel_harness.h>
#include "opbridge/block_cache.h"
#include "opbridge/op.h"
#include "opbridge/shape_infer.h"

using opbridge::testing::error_of;

namespace opbridge {
namespace {

// Kernels that do nothing, one per signature the test specs have.
void unary_kernel(KernelContext&, const TensorView&, TensorView&) {}
void with_k_kernel(KernelContext&, const TensorView&, int64_t, TensorView&) {}
void conv_like_kernel(KernelContext&, const TensorView&, const TensorView*, const std::vector<int64_t>&, int64_t,
                      TensorView&) {}

OpSpec spec_of(OpBuilder b) { return std::move(b).build(); }

OpSpec conv_like() {
  return spec_of(OpBuilder("conv_like")
                     .doc("a test op")
                     .types("T", {DType::Float32})
                     .input("x", "T", "input", 4)
                     .optional_input("w", "T", "weight", 4)
                     .ints_attr("stride", {1, 1}, "stride")
                     .int_attr("k", "kernel size")
                     .output("y", "T", shape::dims({dim("x", 0), dim_of_first({"w", "x"}, 1), (dim("x", 2) - attr("k")) / attr_at("stride", 0) + 1}), "out")
                     .check(dim("x", 1) == 3, "x must have 3 channels")
                     .cpu(conv_like_kernel));
}

TEST(Registry, BuiltinOpsAreValidAndComplete) {
  EXPECT_TRUE(registry().errors().empty()) << registry().errors().front();
  for (const char* name : {"my_add", "dual_residual", "foo", "asinh"}) EXPECT_NE(registry().find(name), nullptr) << name;
  EXPECT_EQ(registry().find("my_add")->export_as.onnx_name, "MyAdd");
  EXPECT_EQ(registry().find("asinh")->export_as.onnx_name, "Asinh");
  ASSERT_EQ(registry().find("asinh")->export_as.rules.size(), 1u);
  EXPECT_EQ(registry().find("asinh")->export_as.rules[0].op_type, "Asinh");
  EXPECT_EQ(registry().find("asinh")->export_as.rules[0].min_opset, 9);
}

TEST(Registry, ManifestNamesEveryOp) {
  std::string m = manifest_json();
  for (const OpSpec& op : registry().ops()) EXPECT_NE(m.find("\"name\":\"" + op.name + "\""), std::string::npos);
  EXPECT_NE(m.find("\"op_type\":\"DualResidual\""), std::string::npos);
  EXPECT_NE(m.find("\"default\":1"), std::string::npos);  // dual_residual's alpha
}

TEST(Registry, RejectsBrokenSpecs) {
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "U", "").output("y", "T", shape::same({"a"}), "").cpu(unary_kernel))); }), "");
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").output("y", "T", shape::same({"b"}), "").cpu(unary_kernel))); }), "");
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).optional_input("a", "T", "").input("b", "T", "").output("y", "T", shape::same({"b"}), "").cpu(unary_kernel))); }), "");
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").output("y", "T", shape::same({"a"}), ""))); }), "");
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").int_attr("is", 1, "").output("y", "T", shape::same({"a"}), "").cpu(unary_kernel))); }).find("Python keyword"), std::string::npos);
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a-b", "T", "").output("y", "T", shape::same({"a-b"}), "").cpu(unary_kernel))); }).find("not an identifier"), std::string::npos);
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").float_attr("f", INFINITY, "").output("y", "T", shape::same({"a"}), "").cpu(unary_kernel))); }).find("non-finite"), std::string::npos);
  EXPECT_EQ(error_of([] { validate_spec(conv_like()); }), "");
  // A data-dependent size stands alone as a dimension; the output's other dims are any rule, and
  // the op's other outputs any shape rule.
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").output("y", "T", shape::dims({data_dependent() + 1}), "").cpu(unary_kernel))); }).find("stand alone"), std::string::npos);
  EXPECT_EQ(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").output("y", "T", shape::dims({dim("a", 0) * 2, data_dependent()}), "").cpu(unary_kernel))); }), "");
  EXPECT_EQ(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").output("y", "T", shape::dims({data_dependent("n")}), "").output("z", "T", shape::same({"a"}), "").cpu(+[](KernelContext&, const TensorView&, TensorView&, TensorView&) {}))); }), "");
  // Export rules name real inputs and attributes.
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").output("y", "T", shape::same({"a"}), "").cpu(unary_kernel).export_as(ExportTo("Foo", 3).inputs({"b"})))); }).find("unknown input 'b'"), std::string::npos);
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").output("y", "T", shape::same({"a"}), "").cpu(unary_kernel).export_as(ExportTo("Foo", 3).attr("k", {"nope"})))); }).find("unknown attribute 'nope'"), std::string::npos);
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").output("y", "T", shape::same({"a"}), "").existing_torch_op("aten::x"))); }).find("nothing to export"), std::string::npos);
}

TEST(ShapeInference, CheckedArithmeticAndFloorDivision) {
  using T = DimTraits<int64_t>;
  EXPECT_EQ(T::floordiv(7, -2), -4);
  EXPECT_EQ(T::floordiv(-7, 2), -4);
  EXPECT_EQ(T::floordiv(7, 2), 3);
  EXPECT_NE(error_of([] { T::floordiv(1, 0); }).find("divides by zero"), std::string::npos);
  EXPECT_NE(error_of([] { T::floordiv(INT64_MIN, -1); }).find("overflows"), std::string::npos);
  EXPECT_NE(error_of([] { T::mul(INT64_MAX / 2, 3); }).find("overflows"), std::string::npos);
  EXPECT_NE(error_of([] { T::add(INT64_MAX, 1); }).find("overflows"), std::string::npos);
}

TEST(ShapeRules, IntegersAreConstants) {
  // shape::dims({dim(...), 3}) and 2 * dim(...) read as constant(3) and constant(2) * dim(...).
  const ShapeRule r = shape::dims({dim("x", 0), 3, 2 * dim("x", 1), dim("x", 1) + 1});
  const ShapeRule same = shape::dims({dim("x", 0), constant(3), constant(2) * dim("x", 1), dim("x", 1) + constant(1)});
  EXPECT_EQ(r.str(), same.str());
  EXPECT_EQ(r.dims[1].node->kind, DimNode::Kind::Const);
  EXPECT_EQ(r.dims[1].node->value, 3);
}

TEST(ShapeInference, DimsRuleWithOptionalFallbackAndAttrs) {
  OpSpec op = conv_like();
  std::vector<AttrValue> attrs = resolve_attrs(op, {std::nullopt, AttrValue{int64_t{3}}});
  Shape x{2, 3, 9, 9}, w{8, 5, 3, 3};
  EXPECT_EQ(ShapeInference<int64_t>(op, {&x, nullptr}, attrs).run()[0], (Shape{2, 3, 7}));
  EXPECT_EQ(ShapeInference<int64_t>(op, {&x, &w}, attrs).run()[0], (Shape{2, 5, 7}));
  Shape bad{2, 4, 9, 9};
  EXPECT_NE(error_of([&] { ShapeInference<int64_t>(op, {&bad, nullptr}, attrs).run(); }).find("x must have 3 channels"), std::string::npos);
  Shape rank3{2, 3, 9};
  EXPECT_NE(error_of([&] { ShapeInference<int64_t>(op, {&rank3, nullptr}, attrs).run(); }).find("must have rank 4"), std::string::npos);
  std::vector<AttrValue> big_k = resolve_attrs(op, {std::nullopt, AttrValue{int64_t{20}}});
  EXPECT_NE(error_of([&] { ShapeInference<int64_t>(op, {&x, nullptr}, big_k).run(); }).find("negative size"), std::string::npos);
}

// A symbolic attribute (computed from sizes by models): the rules take its value as a dimension
// where one is given, its manifest entry says so, and only an int can be one.
TEST(SymbolicAttributes, ShapeRulesTakeTheSymbolicValueAndTheManifestMarksIt) {
  const OpSpec op = spec_of(OpBuilder("pick")
                                .doc("d")
                                .types("T", {DType::Float32})
                                .input("x", "T", "", 2)
                                .sym_int_attr("n", "picks")
                                .output("y", "T", shape::dims({dim("x", 0), attr("n") * 2}), "")
                                .check(attr("n") >= 0, "n must be >= 0")
                                .cpu(with_k_kernel));
  EXPECT_EQ(error_of([&] { validate_spec(op); }), "");
  ASSERT_EQ(op.symbolic_attrs(), (std::vector<size_t>{0}));
  const Shape x{3, 40};
  const std::vector<AttrValue> attrs{int64_t{5}};
  EXPECT_EQ(ShapeInference<int64_t>(op, {&x}, attrs).run()[0], (Shape{3, 10}));
  const std::vector<std::optional<int64_t>> given{int64_t{7}}, none{std::nullopt};
  EXPECT_EQ(ShapeInference<int64_t>(op, {&x}, attrs, given).run()[0], (Shape{3, 14}));
  EXPECT_EQ(ShapeInference<int64_t>(op, {&x}, attrs, none).run()[0], (Shape{3, 10}));
  // The checks see the symbolic value too.
  const std::vector<std::optional<int64_t>> negative{int64_t{-1}};
  EXPECT_EQ(error_of([&] { ShapeInference<int64_t>(op, {&x}, attrs, negative).run(); }), "n must be >= 0, got -1");
  OpSpec bad = op;
  bad.attrs[0].kind = AttrKind::Float;
  EXPECT_NE(error_of([&] { validate_spec(bad); }).find("only an int"), std::string::npos);
  // Every op's attributes in the manifest: furthest_point_sampling's npoint symbolic, tie_threads not.
  const std::string m = manifest_json();
  EXPECT_NE(m.find("\"name\":\"npoint\",\"symbolic\":true"), std::string::npos) << m.substr(0, 300);
  EXPECT_EQ(m.find("\"name\":\"tie_threads\",\"symbolic\""), std::string::npos);
}

TEST(ShapeInference, Broadcast) {
  const OpSpec& op = *registry().find("my_add");
  auto infer = [&](Shape a, Shape b) { return ShapeInference<int64_t>(op, {&a, &b}, {}).run()[0]; };
  EXPECT_EQ(infer({2, 3}, {3}), (Shape{2, 3}));
  EXPECT_EQ(infer({4, 1, 3}, {5, 1}), (Shape{4, 5, 3}));
  EXPECT_EQ(infer({}, {2}), (Shape{2}));
  EXPECT_EQ(infer({0, 3}, {1, 3}), (Shape{0, 3}));
  EXPECT_NE(error_of([&] { infer({2, 3}, {4}); }).find("cannot be broadcast"), std::string::npos);
}

TEST(Attributes, DefaultsKindsAndMissing) {
  OpSpec op = conv_like();
  EXPECT_NE(error_of([&] { resolve_attrs(op, {std::nullopt, std::nullopt}); }).find("required attribute 'k' (int) is missing"), std::string::npos);
  EXPECT_NE(error_of([&] { resolve_attrs(op, {std::nullopt, AttrValue{2.0}}); }).find("attribute 'k' must be int, got float"), std::string::npos);
  auto a = resolve_attrs(op, {std::nullopt, AttrValue{int64_t{1}}});
  EXPECT_EQ(std::get<std::vector<int64_t>>(a[0]), (std::vector<int64_t>{1, 1}));
}

TEST(Types, ResolveAndReject) {
  const OpSpec& op = *registry().find("my_add");
  EXPECT_EQ(resolve_types(op, {DType::Float64, DType::Float64})[0], DType::Float64);
  EXPECT_NE(error_of([&] { resolve_types(op, {DType::Int64, DType::Int64}); }).find("input 'a' has dtype int64; expected float32, float64, float16 or bfloat16"), std::string::npos);
  EXPECT_NE(error_of([&] { resolve_types(op, {DType::Float32, DType::Float64}); }).find("must have the same dtype"), std::string::npos);
}

// Large blocks come back to the next request they fit (at most twice its size); the oldest go
// when the cap is exceeded; a block larger than the cap is never kept.
TEST(BlockCache, ReusesFittingBlocksWithinTheCap) {
  constexpr size_t MiB = size_t{1} << 20;
  BlockCache cache(5 * MiB);
  size_t size = 0;
  void* a = cache.take(2 * MiB, size);
  ASSERT_EQ(size, 2 * MiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  cache.give(a, size);
  size_t again = 0;
  EXPECT_EQ(cache.take(3 * MiB / 2, again), a);  // fits, not more than twice the request
  EXPECT_EQ(again, 2 * MiB);
  cache.give(a, again);
  void* small = cache.take(MiB / 2 + 1, size);  // a kept 2 MiB block is over twice this size
  EXPECT_NE(small, a);
  cache.give(small, size);
  void* big = cache.take(4 * MiB, size);
  EXPECT_NE(big, a);
  cache.give(big, size);  // 2 + 4 MiB > the cap: a, the oldest, is dropped
  EXPECT_EQ(cache.take(4 * MiB, size), big);
  size_t a_size = 0;
  void* fresh = cache.take(2 * MiB, a_size);
  EXPECT_EQ(a_size, 2 * MiB);
  cache.give(fresh, a_size);
  cache.give(big, size);
  void* huge = cache.take(6 * MiB, size);  // above the cap: freed when given back
  cache.give(huge, size);
  EXPECT_EQ(cache.take(4 * MiB, size), big);  // still kept
  cache.give(big, size);
}

// Kernel scratch comes from the process's scratch cache: a second call gets the first's block.
TEST(BlockCache, KernelScratchIsReusedAcrossCalls) {
  auto scratch_of_a_call = [] {
    std::vector<const TensorView*> inputs;
    std::vector<TensorView> outputs;
    std::vector<AttrValue> attrs;
    struct NoHost final : KernelHost {
      void* output_memory(size_t, DType, const Shape&) override { return nullptr; }
      void parallel_for(int64_t n, int64_t, ParallelBody body) override { body(0, n); }
    } host;
    OpSpec spec;
    KernelContext ctx(spec, inputs, outputs, attrs, host);
    return ctx.scratch(3 << 20);
  };
  void* first = scratch_of_a_call();
  EXPECT_EQ(scratch_of_a_call(), first);
}

// A process forked while another thread holds a cache's lock (inside take or give) gets a copy
// of the lock that no thread of its own will release: without the fork handlers its first take of
// a large block would wait forever (a DataLoader worker forked while another thread runs ops). A
// thread takes and gives back blocks without pause while this one forks; each child takes a
// block and must be done within a deadline.
TEST(BlockCache, ForkWhileAnotherThreadUsesItLeavesTheChildAUsableCache) {
  constexpr size_t MiB = size_t{1} << 20;
  BlockCache cache(8 * MiB);
  std::atomic<bool> stop{false};
  std::thread user([&] {
    while (!stop) {
      size_t size = 0;
      void* p = cache.take(MiB, size);
      cache.give(p, size);
    }
  });
  int hung = 0, failed = 0;
  for (int i = 0; i < 50 && hung == 0; ++i) {
    const pid_t pid = fork();
    ASSERT_NE(pid, -1);
    if (pid == 0) {
      size_t size = 0;
      void* p = cache.take(MiB, size);
      cache.give(p, size);
      _exit(0);
    }
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ++hung;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!hung && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) ++failed;
  }
  stop = true;
  user.join();
  EXPECT_EQ(hung, 0) << "a child forked while another thread used the cache never finished its first take";
  EXPECT_EQ(failed, 0);
}

TEST(Strides, RowMajorAndSaturatingForEmptyTensorsWithHugeDims) {
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({2, 0, 4}), (Shape{4, 4, 1}));
  // An empty tensor may declare dimensions whose product is beyond int64 (ONNX Runtime accepts
  // such shapes); the strides saturate rather than overflow.
  const int64_t huge = INT64_MAX;
  EXPECT_EQ(contiguous_strides({0, huge, 2, 2}), (Shape{INT64_MAX, 4, 2, 1}));
  EXPECT_EQ(contiguous_strides({huge, huge, 0}), (Shape{INT64_MAX, 1, 1}));
}

// A kernel's parameters are the op's signature: their number and kinds are checked when the op
// registers, naming the argument; the arguments reach the kernel in the op's order.
TEST(KernelBinding, ParametersMustBeTheSignature) {
  auto builder = [] {
    return OpBuilder("bound").doc("d").types("T", {DType::Float32}).input("a", "T", "").optional_input("b", "T", "")
        .int_attr("k", 2, "").float_attr("f", 0.5, "").ints_attr("l", {1, 2}, "").output("y", "T", shape::same({"a"}), "");
  };
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().cpu(+[](KernelContext&, const TensorView&, const TensorView*, int64_t, double, const std::vector<int64_t>&, TensorView&) {}))); }), "");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().cpu(+[](KernelContext&, const TensorView&, const TensorView*, double, double, const std::vector<int64_t>&, TensorView&) {}))); }),
            "kernel argument 3 is double, but it binds attribute 'k' (int): take it as int64_t");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().cpu(+[](KernelContext&, const TensorView&, const TensorView&, int64_t, double, const std::vector<int64_t>&, TensorView&) {}))); }),
            "kernel argument 2 is const TensorView&, but it binds optional input 'b': take it as const TensorView*");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().cpu(+[](KernelContext&, const TensorView&, TensorView&) {}))); }),
            "the kernel takes 2 arguments after its KernelContext; the op has 6: const TensorView& (input 'a'), "
            "const TensorView* (optional input 'b'), int64_t (attribute 'k' (int)), double (attribute 'f' (float)), "
            "const std::vector<int64_t>& (attribute 'l' (int[])), TensorView& (output 'y')");
  // The arguments, in order, as the kernel sees them.
  OpSpec op = spec_of(builder().cpu(+[](KernelContext&, const TensorView& a, const TensorView* b, int64_t k, double f,
                                        const std::vector<int64_t>& l, TensorView& y) {
    float* out = y.data_as<float>();
    out[0] = a.data_as<float>()[0];
    out[1] = b ? b->data_as<float>()[0] : -1.0f;
    out[2] = static_cast<float>(k) + static_cast<float>(f) + static_cast<float>(l.at(1));
  }));
  std::vector<float> av{7, 0, 0}, bv{9};
  TensorView a{av.data(), DType::Float32, {3}, {1}}, b{bv.data(), DType::Float32, {1}, {1}};
  std::vector<AttrValue> attrs = resolve_attrs(op, {AttrValue{int64_t{4}}, std::nullopt, std::nullopt});
  for (const TensorView* given : std::initializer_list<const TensorView*>{&b, nullptr}) {
    testing::TestHost host(1, /*threaded=*/false);
    run_kernel(op, {&a, given}, attrs, host);
    EXPECT_EQ(host.outputs[0].values<float>(), (std::vector<float>{7, given ? 9.0f : -1.0f, 4 + 0.5f + 2}));
  }
}

// A Python-level operator's parameters bind the op's inputs and attributes by name: every
// required one once, nothing the op does not have, fixed values of the attribute's kind.
TEST(PythonOperators, ParametersBindTheSignature) {
  auto builder = [] {
    return OpBuilder("bound").doc("d").types("T", {DType::Float32}).input("a", "T", "").optional_input("b", "T", "")
        .int_attr("k", "").bool_attr("flag", false, "").output("y", "T", shape::same({"a"}), "")
        .cpu(+[](KernelContext&, const TensorView&, const TensorView*, int64_t, bool, TensorView&) {});
  };
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().replaces("pkg.mod.Fn", {"k", "", "a"}, {{"flag", true}}))); }), "");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().replaces("Fn", {"a", "k"}))); }),
            "replaces: 'Fn' is not a qualified name such as 'package.module.Function'");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().replaces("pkg.Fn", {"a", "kk"}))); }),
            "replaces 'pkg.Fn': parameter binds 'kk', which is neither an input nor an attribute");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().replaces("pkg.Fn", {"a", "a", "k"}))); }),
            "replaces 'pkg.Fn': two parameters bind 'a'");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().replaces("pkg.Fn", {"k"}))); }),
            "replaces 'pkg.Fn': no parameter binds input 'a'");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().replaces("pkg.Fn", {"a"}))); }),
            "replaces 'pkg.Fn': no parameter binds attribute 'k', which has no default");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().replaces("pkg.Fn", {"a", "k"}, {{"flag", int64_t{1}}}))); }),
            "replaces 'pkg.Fn': the value fixed for 'flag' is not of its kind");
  EXPECT_EQ(error_of([&] { validate_spec(spec_of(builder().replaces("pkg.Fn", {"a", "k"}, {{"k", int64_t{1}}}))); }),
            "replaces 'pkg.Fn': 'k' is both a parameter and fixed");
}

TEST(Names, CamelCase) {
  EXPECT_EQ(camel_case("knn_query"), "KnnQuery");
  EXPECT_EQ(camel_case("foo"), "Foo");
  EXPECT_EQ(camel_case("deform_conv2d"), "DeformConv2d");
}

}  // namespace
}  // namespace opbridge

namespace opbridge {
namespace {
TEST(KernelContext, AllocateOutputChecksTheRule) {
  OpSpec op = spec_of(OpBuilder("dd").doc("d").types("T", {DType::Float32}).input("a", "T", "", 1)
                          .output("y", "T", shape::dims({dim("a", 0), data_dependent()}), "").cpu(unary_kernel));
  std::vector<float> data(3);
  TensorView a{data.data(), DType::Float32, {3}, {1}};
  std::vector<AttrValue> attrs;
  PreparedCall call = prepare_call(op, {&a}, attrs);
  ASSERT_EQ(call.output_shapes[0], (Shape{3, kDataDependentDim}));
  testing::TestHost host(1, /*threaded=*/false);
  std::vector<const TensorView*> inputs{&a};
  std::vector<TensorView> outputs{TensorView{nullptr, DType::Float32, call.output_shapes[0], {}}};
  KernelContext ctx(op, inputs, outputs, attrs, host);
  EXPECT_THROW(ctx.check_outputs_allocated(), Error);
  EXPECT_THROW(ctx.allocate_output(outputs[0], {3}), Error);     // wrong rank
  EXPECT_THROW(ctx.allocate_output(outputs[0], {4, 2}), Error);  // the rule fixes axis 0 to 3
  EXPECT_THROW(ctx.allocate_output(outputs[0], {3, -2}), Error);
  TensorView other;
  EXPECT_THROW(ctx.allocate_output(other, {3, 5}), Error);  // not an output of the call
  TensorView& y = ctx.allocate_output(outputs[0], {3, 5});
  EXPECT_EQ(y.shape, (Shape{3, 5}));
  EXPECT_EQ(y.strides, (Shape{5, 1}));
  y.data_as<float>()[14] = 1.0f;  // all 15 elements are writable
  EXPECT_THROW(ctx.allocate_output(outputs[0], {3, 5}), Error);  // once
  EXPECT_NO_THROW(ctx.check_outputs_allocated());
}

// Outputs that name the same data-dependent size must get one value from the kernel.
TEST(KernelContext, NamedDataDependentSizesAgree) {
  OpSpec op = spec_of(OpBuilder("pairs").doc("d").types("T", {DType::Float32}).input("a", "T", "", 1)
                          .output("row", "T", shape::dims({data_dependent("pairs")}), "")
                          .output("col", "T", shape::dims({data_dependent("pairs")}), "")
                          .cpu(+[](KernelContext&, const TensorView&, TensorView&, TensorView&) {}));
  std::vector<float> data(3);
  TensorView a{data.data(), DType::Float32, {3}, {1}};
  std::vector<AttrValue> attrs;
  std::vector<const TensorView*> inputs{&a};
  for (int64_t col : {4, 5}) {
    testing::TestHost host(2, /*threaded=*/false);
    std::vector<TensorView> outputs(2, TensorView{nullptr, DType::Float32, {kDataDependentDim}, {}});
    KernelContext ctx(op, inputs, outputs, attrs, host);
    ctx.allocate_output(outputs[0], {4});
    ctx.allocate_output(outputs[1], {col});
    const std::string e = error_of([&] { ctx.check_outputs_allocated(); });
    if (col == 4) EXPECT_EQ(e, "");
    else EXPECT_EQ(e, "the kernel gave the data-dependent size 'pairs' two values: 4 (output 'row') and 5 (output "
                      "'col') (a bug in the op's kernel)");
  }
}

// Every allocation that fails says what it was for: an output (its name, shape and bytes), with
// the host's own reason when it gave one, or the kernel's working memory (the inputs' shapes).
TEST(KernelCall, AllocationFailuresNameWhatWasAllocated) {
  struct RefusingHost final : KernelHost {
    bool bad_alloc = true;
    void* output_memory(size_t, DType, const Shape&) override {
      if (bad_alloc) throw std::bad_alloc();
      throw std::runtime_error("the allocator said no\nat allocator.cc:12");
    }
    void parallel_for(int64_t n, int64_t, ParallelBody body) override { body(0, n); }
  };
  OpSpec op = spec_of(OpBuilder("alloc").doc("d").types("T", {DType::Float32}).input("a", "T", "", 1)
                          .int_attr("k", "").output("y", "T", shape::dims({dim("a", 0), attr("k")}), "")
                          .cpu(with_k_kernel));
  std::vector<float> data(3);
  TensorView a{data.data(), DType::Float32, {3}, {1}};
  RefusingHost host;
  const std::vector<AttrValue> attrs{int64_t{1} << 40};
  EXPECT_EQ(error_of([&] { run_kernel(op, {&a}, attrs, host); }),
            "output 'y' of shape [3, 1099511627776] (13194139533312 bytes) cannot be allocated: out of memory");
  host.bad_alloc = false;
  EXPECT_EQ(error_of([&] { run_kernel(op, {&a}, attrs, host); }),
            "output 'y' of shape [3, 1099511627776] (13194139533312 bytes) cannot be allocated: the allocator said no");
  OpSpec greedy = spec_of(OpBuilder("greedy").doc("d").types("T", {DType::Float32}).input("a", "T", "", 1)
                              .output("y", "T", shape::same({"a"}), "")
                              .cpu(+[](KernelContext&, const TensorView&, TensorView&) { throw std::bad_alloc(); }));
  testing::TestHost ok(1, /*threaded=*/false);
  const std::vector<AttrValue> none;
  EXPECT_EQ(error_of([&] { run_kernel(greedy, {&a}, none, ok); }),
            "out of memory: the kernel's working memory for inputs a [3] cannot be allocated");
  std::vector<const TensorView*> inputs{&a};
  std::vector<TensorView> outputs;
  KernelContext ctx(greedy, inputs, outputs, none, ok);
  EXPECT_EQ(error_of([&] { ctx.scratch(size_t{1} << 62); }),
            "scratch memory of 4611686018427387904 bytes cannot be allocated: out of memory");
}
}  // namespace
}  // namespace opbridge

namespace opbridge {
namespace {
TEST(Checks, InequalitiesOnAttributesAndDims) {
  OpSpec op = spec_of(OpBuilder("ineq").doc("d").types("T", {DType::Float32}).input("a", "T", "", 1)
                          .int_attr("k", "").check(attr("k") >= 1, "k must be >= 1")
                          .check(dim("a", 0) > attr("k"), "a needs more than k rows")
                          .output("y", "T", shape::same({"a"}), "").cpu(with_k_kernel));
  EXPECT_NE(error_of([] { validate_spec(spec_of(OpBuilder("x").doc("d").types("T", {DType::Float32}).input("a", "T", "").int_attr("k", "").check(attr("nope") >= 1, "").output("y", "T", shape::same({"a"}), "").cpu(with_k_kernel))); }).find("unknown attribute 'nope'"), std::string::npos);
  std::vector<int64_t> shape3{3};
  auto run_with = [&](int64_t k) {
    std::vector<AttrValue> attrs{AttrValue{k}};
    return error_of([&] { ShapeInference<int64_t>(op, {&shape3}, attrs).run(); });
  };
  EXPECT_EQ(run_with(2), "");
  EXPECT_NE(run_with(0).find("k must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(run_with(3).find("a needs more than k rows (a.shape[0] = 3, k = 3)"), std::string::npos);
  EXPECT_EQ(op.checks[0].str(), "k >= 1");
  // Overflow names the expression, so the input or attribute behind it.
  OpSpec big = spec_of(OpBuilder("big").doc("d").types("T", {DType::Float32}).input("a", "T", "", 1).int_attr("k", "")
                           .output("y", "T", shape::dims({dim("a", 0) * attr("k")}), "").cpu(with_k_kernel));
  std::vector<AttrValue> huge{AttrValue{int64_t{1} << 62}};
  EXPECT_EQ(error_of([&] { ShapeInference<int64_t>(big, {&shape3}, huge).run(); }),
            "shape rule a.shape[0] * k overflows int64 (3 * 4611686018427387904)");
  EXPECT_EQ(op.checks[1].str(), "a.shape[0] > k");
}
}  // namespace
}  // namespace opbridge

namespace opbridge {
namespace {
// A reused PreparedCall skips the rules only for the key it last passed with: the same op, input
// dtypes and shapes and attributes; anything else runs them (and their checks) again.
TEST(PreparedCall, ReusesTheLastResultOnlyForTheSameKey) {
  OpSpec op = spec_of(OpBuilder("keyed").doc("d").types("T", {DType::Float32, DType::Float64}).input("a", "T", "", 1)
                          .int_attr("k", "").check(dim("a", 0) > attr("k"), "a needs more than k rows")
                          .output("y", "T", shape::dims({dim("a", 0) * attr("k")}), "").cpu(with_k_kernel));
  OpSpec other = spec_of(OpBuilder("other").doc("d").types("T", {DType::Float32, DType::Float64}).input("a", "T", "", 1)
                             .int_attr("k", "").output("y", "T", shape::dims({dim("a", 0) + attr("k")}), "")
                             .cpu(with_k_kernel));
  std::vector<float> f(8);
  std::vector<double> d(8);
  TensorView a3{f.data(), DType::Float32, {3}, {1}}, a5{f.data(), DType::Float32, {5}, {1}};
  TensorView d3{d.data(), DType::Float64, {3}, {1}};
  std::vector<AttrValue> k2{AttrValue{int64_t{2}}}, k4{AttrValue{int64_t{4}}};
  PreparedCall call;
  auto shape_of = [&](const OpSpec& o, const TensorView& a, const std::vector<AttrValue>& attrs) {
    prepare_call(o, {&a}, attrs, call);
    return call.output_shapes.at(0);
  };
  EXPECT_EQ(shape_of(op, a3, k2), (Shape{6}));
  EXPECT_EQ(shape_of(op, a3, k2), (Shape{6}));
  EXPECT_EQ(shape_of(op, a5, k2), (Shape{10}));       // another shape
  EXPECT_EQ(shape_of(op, a5, k4), (Shape{20}));       // another attribute
  EXPECT_EQ(shape_of(other, a5, k4), (Shape{9}));     // another op
  EXPECT_EQ(shape_of(op, d3, k2), (Shape{6}));
  EXPECT_EQ(call.output_dtypes.at(0), DType::Float64);  // another dtype
  EXPECT_EQ(shape_of(op, a3, k2), (Shape{6}));
  EXPECT_EQ(call.output_dtypes.at(0), DType::Float32);
  // A call that fails its check is never remembered: the same call fails again.
  EXPECT_NE(error_of([&] { shape_of(op, a3, k4); }).find("a needs more than k rows"), std::string::npos);
  EXPECT_NE(error_of([&] { shape_of(op, a3, k4); }).find("a needs more than k rows"), std::string::npos);
  EXPECT_EQ(shape_of(op, a3, k2), (Shape{6}));
}
}  // namespace
}  // namespace opbridge

namespace opbridge {
namespace {
TEST(ExportRules, InputWhenAppliesToTheDefaultInputsAndNamesARealOne) {
  OpSpec op = spec_of(OpBuilder("w").doc("d").types("T", {DType::Float32}).input("a", "T", "").optional_input("b", "T", "")
                          .bool_attr("flag", false, "").output("y", "T", shape::same({"a"}), "").cpu(unary_kernel)
                          .export_as(ExportTo("Add", 7).input_when("b", "flag")));
  resolve_export(op);
  ASSERT_EQ(op.export_as.rules[0].inputs.size(), 2u);
  EXPECT_EQ(op.export_as.rules[0].inputs[1].when, "flag");
  OpSpec bad = spec_of(OpBuilder("w").doc("d").types("T", {DType::Float32}).input("a", "T", "")
                           .bool_attr("flag", false, "").output("y", "T", shape::same({"a"}), "").cpu(unary_kernel)
                           .export_as(ExportTo("Add", 7).inputs({"a"}).input_when("c", "flag")));
  EXPECT_NE(error_of([&] { resolve_export(bad); }).find("input_when names input 'c'"), std::string::npos);
}
}  // namespace
}  // namespace opbridge

namespace opbridge {
namespace {
TEST(Checks, UpperBounds) {
  OpSpec op = spec_of(OpBuilder("upper").doc("d").types("T", {DType::Float32}).input("a", "T", "", 1)
                          .int_attr("k", "").check(attr("k") <= dim("a", 0), "k must be at most the number of rows")
                          .check(attr("k") < 8, "k must be below 8")
                          .output("y", "T", shape::same({"a"}), "").cpu(with_k_kernel));
  std::vector<int64_t> shape5{5};
  auto run_with = [&](int64_t k) {
    std::vector<AttrValue> attrs{AttrValue{k}};
    return error_of([&] { ShapeInference<int64_t>(op, {&shape5}, attrs).run(); });
  };
  EXPECT_EQ(run_with(5), "");
  EXPECT_EQ(run_with(6), "k must be at most the number of rows (k = 6, a.shape[0] = 5)");
  std::vector<int64_t> shape9{9};
  std::vector<AttrValue> eight{AttrValue{int64_t{8}}};
  EXPECT_EQ(error_of([&] { ShapeInference<int64_t>(op, {&shape9}, eight).run(); }), "k must be below 8, got 8");
  EXPECT_EQ(op.checks[0].str(), "k <= a.shape[0]");
  EXPECT_EQ(op.checks[1].str(), "k < 8");
}

TEST(ExportRules, TargetsNodesOfOtherDomainsAndStatesTheirDtypes) {
  OpSpec op = spec_of(OpBuilder("n").doc("d").types("T", {DType::Float32, DType::Float64}).input("a", "T", "")
                          .output("y", "T", shape::same({"a"}), "").cpu(unary_kernel)
                          .export_as(ExportTo::node("com.microsoft", "Thing").target_types("T", {DType::Float32}))
                          .export_as(ExportTo::opbridge_op("other_ns::thing", 19)));
  resolve_export(op);
  EXPECT_EQ(error_of([&] { check_export(op); }), "");
  const ExportRule& node = op.export_as.rules[0];
  EXPECT_EQ(node.target_domain + "::" + node.target_type, "com.microsoft::Thing");
  const ExportRule& other = op.export_as.rules[1];
  EXPECT_EQ(other.library + "::" + other.op_type, "other_ns::thing");
  EXPECT_EQ(other.opbridge_op(), "other_ns::thing");
  EXPECT_TRUE(other.target_type.empty());  // left for the export glue, which sees every library
  OpSpec bad = spec_of(OpBuilder("n").doc("d").types("T", {DType::Float32}).input("a", "T", "")
                           .output("y", "T", shape::same({"a"}), "").cpu(unary_kernel)
                           .export_as(ExportTo("Abs", 6).target_types("T", {DType::Float64})));
  resolve_export(bad);
  EXPECT_EQ(error_of([&] { check_export(bad); }),
            "export rule Abs: target_types names float64 for 'T', which the op does not take");
}

TEST(OwnNode, ChosenNameAndDomain) {
  OpSpec op = spec_of(OpBuilder("vendor_thing").doc("d").types("T", {DType::Float32}).input("a", "T", "")
                          .output("y", "T", shape::same({"a"}), "").cpu(unary_kernel).onnx_node("vThing", "vendor", 3));
  resolve_export(op);
  EXPECT_EQ(op.export_as.onnx_domain + "::" + op.export_as.onnx_name, "vendor::vThing");
  EXPECT_EQ(op.export_as.onnx_version, 3);
  OpSpec plain = spec_of(OpBuilder("plain_thing").doc("d").types("T", {DType::Float32}).input("a", "T", "")
                             .output("y", "T", shape::same({"a"}), "").cpu(unary_kernel));
  resolve_export(plain);
  EXPECT_EQ(plain.export_as.onnx_domain, this_library().onnx_domain);
  EXPECT_EQ(plain.export_as.onnx_name, "PlainThing");
  EXPECT_EQ(plain.export_as.onnx_version, this_library().onnx_domain_version);
}
}  // namespace
}  // namespace opbridge

namespace opbridge {
namespace {
// Reference conversions by exhaustive search: the nearest representable value, ties to the even
// encoding (the one whose last bit is 0), over every finite 16-bit pattern.
template <typename H>
uint16_t nearest(float f) {
  uint16_t best = 0;
  double best_err = 1e300;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float v = to_float(H{static_cast<uint16_t>(b)});
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(f)) continue;
    const double err = std::abs(static_cast<double>(v) - static_cast<double>(f));
    if (err < best_err || (err == best_err && (b & 1) == 0)) best = static_cast<uint16_t>(b), best_err = err;
  }
  return best;
}

TEST(Half, ConversionsRoundToNearestEven) {
  // Known encodings.
  EXPECT_EQ(to_float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(to_float16(-2.0f).bits, 0xc000);
  EXPECT_EQ(to_float16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(to_float16(65520.0f).bits, 0x7c00);  // halfway to the next power: rounds to inf
  EXPECT_EQ(to_float16(5.9604644775390625e-8f).bits, 0x0001);  // the smallest subnormal
  EXPECT_EQ(to_float16(2.98e-8f).bits, 0x0000);  // below half of it
  EXPECT_TRUE(std::isnan(to_float(to_float16(std::nanf("")))));
  EXPECT_EQ(to_bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_bfloat16(3.140625f).bits, 0x4049);
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(std::nanf("")))));
  // Every 16-bit value converts to float and back unchanged.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f16 = to_float(Float16{static_cast<uint16_t>(b)}), bf = to_float(BFloat16{static_cast<uint16_t>(b)});
    if (!std::isnan(f16)) {
      EXPECT_EQ(to_float16(f16).bits, b);
    }
    if (!std::isnan(bf)) {
      EXPECT_EQ(to_bfloat16(bf).bits, b);
    }
  }
  // Floats between 16-bit values (ties included) round to the nearest, ties to even.
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  std::vector<float> probes = {1.00048828125f, 1.00146484375f, 6.1035156e-05f, 3.0517578e-05f, 2049.0f, 2051.0f};
  for (int i = 0; i < 200; ++i) probes.push_back(u(g) * std::pow(2.0f, -static_cast<float>(i % 40)));
  for (float f : probes) {
    if (std::abs(f) < 65504.0f) {
      EXPECT_EQ(to_float16(f).bits, nearest<Float16>(f)) << f;
    }
    EXPECT_EQ(to_bfloat16(f).bits, nearest<BFloat16>(f)) << f;
  }
}
}  // namespace
}  // namespace opbridge
