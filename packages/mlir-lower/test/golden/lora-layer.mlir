// StageML graph @lora_layer lowered by @stageml/mlir-lower (func, arith, math, linalg, tensor, scf; MLIR 19).
// Arguments: 1 inputs, 4 parameters; 0 resource blobs.
// Verify: mlir-opt-19 --verify-each FILE -o /dev/null
module {
  func.func @lora_layer(%x: tensor<?x64xf32> {stageml.input = "x"}, %w: tensor<96x64xf32> {stageml.constant = "w"}, %bias: tensor<96xf32> {stageml.constant = "bias"}, %lora_A: tensor<8x64xf32> {stageml.constant = "lora_A"}, %lora_B: tensor<96x8xf32> {stageml.constant = "lora_B"}) -> (tensor<?x96xf32> {stageml.output = "y"}) {
    %c0 = arith.constant 0 : index
    %batch = tensor.dim %x, %c0 : tensor<?x64xf32>
    %zero_f32 = arith.constant 0.0 : f32
    %base_init = tensor.empty(%batch) : tensor<?x96xf32>
    %base_bias = linalg.broadcast ins(%bias : tensor<96xf32>) outs(%base_init : tensor<?x96xf32>) dimensions = [0]
    %base = linalg.matmul_transpose_b ins(%x, %w : tensor<?x64xf32>, tensor<96x64xf32>) outs(%base_bias : tensor<?x96xf32>) -> tensor<?x96xf32>
    %shrink_init_empty = tensor.empty(%batch) : tensor<?x8xf32>
    %shrink_init = linalg.fill ins(%zero_f32 : f32) outs(%shrink_init_empty : tensor<?x8xf32>) -> tensor<?x8xf32>
    %shrink = linalg.matmul_transpose_b ins(%x, %lora_A : tensor<?x64xf32>, tensor<8x64xf32>) outs(%shrink_init : tensor<?x8xf32>) -> tensor<?x8xf32>
    %expand_init_empty = tensor.empty(%batch) : tensor<?x96xf32>
    %expand_init = linalg.fill ins(%zero_f32 : f32) outs(%expand_init_empty : tensor<?x96xf32>) -> tensor<?x96xf32>
    %expand = linalg.matmul_transpose_b ins(%shrink, %lora_B : tensor<?x8xf32>, tensor<96x8xf32>) outs(%expand_init : tensor<?x96xf32>) -> tensor<?x96xf32>
    %scale = arith.constant dense<2.0> : tensor<f32>
    %delta_init = tensor.empty(%batch) : tensor<?x96xf32>
    %delta = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> ()>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%expand, %scale : tensor<?x96xf32>, tensor<f32>) outs(%delta_init : tensor<?x96xf32>) {
    ^bb0(%0: f32, %1: f32, %2: f32):
      %3 = arith.mulf %0, %1 : f32
      linalg.yield %3 : f32
    } -> tensor<?x96xf32>
    %y_init = tensor.empty(%batch) : tensor<?x96xf32>
    %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%base, %delta : tensor<?x96xf32>, tensor<?x96xf32>) outs(%y_init : tensor<?x96xf32>) {
    ^bb0(%4: f32, %5: f32, %6: f32):
      %7 = arith.addf %4, %5 : f32
      linalg.yield %7 : f32
    } -> tensor<?x96xf32>
    func.return %y : tensor<?x96xf32>
  }
}
