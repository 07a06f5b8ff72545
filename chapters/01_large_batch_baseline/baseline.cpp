// baseline.cpp: chapter 01's setting and its training loop.
#include "chapters/01_large_batch_baseline/baseline.hpp"

#include <algorithm>
#include <cstdio>

namespace bigbatch::baseline {

nn::ModelConfig model_config() {
  return {.inputs = 784, .hidden = 256, .expansion = 4, .classes = 10, .depth = 2,
          .dropout = 0.0f, .norm = nn::Norm::layer, .activation = nn::Activation::gelu,
          .seed = 1};
}

AdamWOptions adamw_options() {
  AdamWOptions options;
  options.lr = 1e-3;
  return options;
}

Data load_data(bool quick) {
  Data d;
  d.fashion_mnist = fashion_mnist_available();
  if (d.fashion_mnist) {
    d.train = load_fashion_mnist(FashionMnistSplit::train);
    d.test = load_fashion_mnist(FashionMnistSplit::test);
  } else {
    std::printf(
        "Fashion-MNIST not found in %s (Debian package dataset-fashion-mnist): "
        "using synthetic data of the same shape instead\n",
        default_fashion_mnist_directory().c_str());
    SyntheticOptions options;
    options.samples = 70000;
    const Dataset all = make_synthetic(options);
    d.train = slice(all, 0, 60000);
    d.test = slice(all, 60000, 70000);
  }
  if (quick) {
    d.train = slice(d.train, 0, 4096);
    d.test = slice(d.test, 0, 1000);
  }
  return d;
}

BaselineLoop::BaselineLoop(nn::Model& model, nn::Optimizer& optimizer, const Dataset& data,
                           std::int64_t batch, std::int64_t micro_batch, std::uint64_t seed)
    : model_(model),
      optimizer_(optimizer),
      stream_(data, batch, /*shuffle=*/true, seed, nn::LastBatch::keep_short),
      micro_batch_(micro_batch),
      dropout_seed_(nn::dropout_seed_for_run(seed)),
      staging_(std::min(micro_batch, batch), data.feature_dim(), model.device()) {}

// snippet: step
float BaselineLoop::step(std::int64_t k, float loss_scale,
                         const std::function<bool()>& at_boundary) {
  const nn::BatchPosition batch = stream_.position(k);
  model_.zero_grad();
  // Micro-batch after micro-batch: its samples copied to the device, forward, loss
  // (divided by the batch's size), backward that adds into the gradients; with
  // micro_batch >= the batch, all rows at once.
  const float loss =
      nn::accumulate_gradients(model_, batch.size, staging_.rows_of(stream_, k), micro_batch_,
                               {true, dropout_seed_, batch.first_row}, batch.size, loss_scale);
  if (at_boundary()) optimizer_.step();
  return loss;
}
// snippet end: step

}  // namespace bigbatch::baseline
