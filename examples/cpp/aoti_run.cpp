// Runs a model that uses sparsejit ops, exported with torch.export and compiled by
// AOTInductor (torch._inductor.aoti_compile_and_package), from a plain C++ program.
//
//   aoti_run <model.pt2> <inputs.pt> <outputs.pt>
//
// inputs.pt: a tuple or list of tensors saved by Python's torch.save (the model's positional
// inputs, in order); outputs.pt: the model's outputs as a tuple of tensors, readable by
// torch.load. The only sparsejit-specific step is that the op library must be loaded before
// the package runs: the compiled model calls sparsejit's ops through the dispatcher by name.
// Linking sparsejit::sparsejit_ops (with --no-as-needed, since no symbol of it is referenced
// here; see CMakeLists.txt) registers them when the program starts.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<at::Tensor> load_inputs(const std::string& path) {
  const c10::IValue v = torch::pickle_load(read_file(path));
  std::vector<at::Tensor> out;
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) out.push_back(e.toTensor());
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) out.push_back(e.toTensor());
  } else {
    throw std::runtime_error(path + ": expected a tensor, or a tuple or list of tensors");
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " <model.pt2> <inputs.pt> <outputs.pt>\n";
    return 2;
  }
  try {
    if (!c10::Dispatcher::singleton().findSchema({"sparsejit::spmm", ""}).has_value())
      throw std::runtime_error("sparsejit's op library is not loaded (link sparsejit_ops)");
    torch::inductor::AOTIModelPackageLoader loader(argv[1]);
    std::vector<at::Tensor> inputs = load_inputs(argv[2]);
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> outputs = loader.run(inputs);
    // a tuple of tensors: torch.load reads it with its default weights_only=True
    std::vector<c10::IValue> items(outputs.begin(), outputs.end());
    const std::vector<char> bytes =
        torch::pickle_save(c10::IValue(c10::ivalue::Tuple::create(std::move(items))));
    std::ofstream(argv[3], std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    std::cout << "ran " << argv[1] << ": " << inputs.size() << " inputs -> " << outputs.size()
              << " outputs";
    for (auto& t : outputs) std::cout << " " << t.sizes();
    std::cout << "\n";
  } catch (const std::exception& e) {
    std::cerr << "aoti_run: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
