// StageML graph @attention_block lowered by @stageml/mlir-lower (func, arith, math, linalg, tensor, scf; MLIR 19).
// Arguments: 4 inputs, 5 parameters; 0 resource blobs.
// Verify: mlir-opt-19 --verify-each FILE -o /dev/null
module {
  func.func @attention_block(%x: tensor<?x?x16xf32> {stageml.input = "x"}, %cos: tensor<?x1x?x4xf32> {stageml.input = "cos"}, %sin: tensor<?x1x?x4xf32> {stageml.input = "sin"}, %mask: tensor<?x1x1x?xf32> {stageml.input = "mask"}, %norm: tensor<16xf32> {stageml.param = "norm"}, %wq: tensor<16x16xf32> {stageml.param = "wq"}, %wk: tensor<8x16xf32> {stageml.param = "wk"}, %wv: tensor<8x16xf32> {stageml.param = "wv"}, %wo: tensor<16x16xf32> {stageml.param = "wo"}) -> (tensor<?x?x16xf32> {stageml.output = "y"}) {
    %c0 = arith.constant 0 : index
    %batch = tensor.dim %x, %c0 : tensor<?x?x16xf32>
    %c1 = arith.constant 1 : index
    %seq = tensor.dim %x, %c1 : tensor<?x?x16xf32>
    %cst_f32 = arith.constant 16.0 : f32
    %zero_f32 = arith.constant 0.0 : f32
    %cst_f32_1 = arith.constant 0.000001 : f32
    %one_f32 = arith.constant 1.0 : f32
    %c2 = arith.constant 2 : index
    %cst_f32_2 = arith.constant 0.5 : f32
    %ninf_f32 = arith.constant 0xFF800000 : f32
    %rmsNorm_sq_init_empty = tensor.empty(%batch, %seq) : tensor<?x?xf32>
    %rmsNorm_sq_init = linalg.fill ins(%zero_f32 : f32) outs(%rmsNorm_sq_init_empty : tensor<?x?xf32>) -> tensor<?x?xf32>
    %rmsNorm_sq = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%x : tensor<?x?x16xf32>) outs(%rmsNorm_sq_init : tensor<?x?xf32>) {
    ^bb0(%0: f32, %1: f32):
      %2 = arith.mulf %0, %0 : f32
      %3 = arith.addf %1, %2 : f32
      linalg.yield %3 : f32
    } -> tensor<?x?xf32>
    %rmsNorm_init = tensor.empty(%batch, %seq) : tensor<?x?x16xf32>
    %rmsNorm = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>, affine_map<(d0, d1, d2) -> (d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x, %rmsNorm_sq, %norm : tensor<?x?x16xf32>, tensor<?x?xf32>, tensor<16xf32>) outs(%rmsNorm_init : tensor<?x?x16xf32>) {
    ^bb0(%4: f32, %5: f32, %6: f32, %7: f32):
      %8 = arith.divf %5, %cst_f32 : f32
      %9 = arith.addf %8, %cst_f32_1 : f32
      %10 = math.sqrt %9 : f32
      %11 = arith.divf %one_f32, %10 : f32
      %12 = arith.mulf %4, %11 : f32
      %13 = arith.mulf %12, %6 : f32
      linalg.yield %13 : f32
    } -> tensor<?x?x16xf32>
    %linear_init_empty = tensor.empty(%batch, %seq) : tensor<?x?x16xf32>
    %linear_init = linalg.fill ins(%zero_f32 : f32) outs(%linear_init_empty : tensor<?x?x16xf32>) -> tensor<?x?x16xf32>
    %linear = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%rmsNorm, %wq : tensor<?x?x16xf32>, tensor<16x16xf32>) outs(%linear_init : tensor<?x?x16xf32>) {
    ^bb0(%14: f32, %15: f32, %16: f32):
      %17 = arith.mulf %14, %15 : f32
      %18 = arith.addf %16, %17 : f32
      linalg.yield %18 : f32
    } -> tensor<?x?x16xf32>
    %reshape = tensor.expand_shape %linear [[0], [1], [2, 3]] output_shape [%batch, %seq, 4, 4] : tensor<?x?x16xf32> into tensor<?x?x4x4xf32>
    %transpose_init = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %transpose = linalg.transpose ins(%reshape : tensor<?x?x4x4xf32>) outs(%transpose_init : tensor<?x4x?x4xf32>) permutation = [0, 2, 1, 3]
    %rotary_init = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %rotary = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%transpose, %cos, %sin : tensor<?x4x?x4xf32>, tensor<?x1x?x4xf32>, tensor<?x1x?x4xf32>) outs(%rotary_init : tensor<?x4x?x4xf32>) {
    ^bb0(%19: f32, %20: f32, %21: f32, %22: f32):
      %23 = linalg.index 0 : index
      %24 = linalg.index 1 : index
      %25 = linalg.index 2 : index
      %26 = linalg.index 3 : index
      %27 = arith.cmpi ult, %26, %c2 : index
      %28 = arith.addi %26, %c2 : index
      %29 = arith.subi %26, %c2 : index
      %30 = arith.select %27, %28, %29 : index
      %31 = tensor.extract %transpose[%23, %24, %25, %30] : tensor<?x4x?x4xf32>
      %32 = arith.negf %31 : f32
      %33 = arith.select %27, %32, %31 : f32
      %34 = arith.mulf %19, %20 : f32
      %35 = arith.mulf %33, %21 : f32
      %36 = arith.addf %34, %35 : f32
      linalg.yield %36 : f32
    } -> tensor<?x4x?x4xf32>
    %linear_1_init_empty = tensor.empty(%batch, %seq) : tensor<?x?x8xf32>
    %linear_1_init = linalg.fill ins(%zero_f32 : f32) outs(%linear_1_init_empty : tensor<?x?x8xf32>) -> tensor<?x?x8xf32>
    %linear_1 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%rmsNorm, %wk : tensor<?x?x16xf32>, tensor<8x16xf32>) outs(%linear_1_init : tensor<?x?x8xf32>) {
    ^bb0(%37: f32, %38: f32, %39: f32):
      %40 = arith.mulf %37, %38 : f32
      %41 = arith.addf %39, %40 : f32
      linalg.yield %41 : f32
    } -> tensor<?x?x8xf32>
    %reshape_1 = tensor.expand_shape %linear_1 [[0], [1], [2, 3]] output_shape [%batch, %seq, 2, 4] : tensor<?x?x8xf32> into tensor<?x?x2x4xf32>
    %transpose_1_init = tensor.empty(%batch, %seq) : tensor<?x2x?x4xf32>
    %transpose_1 = linalg.transpose ins(%reshape_1 : tensor<?x?x2x4xf32>) outs(%transpose_1_init : tensor<?x2x?x4xf32>) permutation = [0, 2, 1, 3]
    %rotary_1_init = tensor.empty(%batch, %seq) : tensor<?x2x?x4xf32>
    %rotary_1 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%transpose_1, %cos, %sin : tensor<?x2x?x4xf32>, tensor<?x1x?x4xf32>, tensor<?x1x?x4xf32>) outs(%rotary_1_init : tensor<?x2x?x4xf32>) {
    ^bb0(%42: f32, %43: f32, %44: f32, %45: f32):
      %46 = linalg.index 0 : index
      %47 = linalg.index 1 : index
      %48 = linalg.index 2 : index
      %49 = linalg.index 3 : index
      %50 = arith.cmpi ult, %49, %c2 : index
      %51 = arith.addi %49, %c2 : index
      %52 = arith.subi %49, %c2 : index
      %53 = arith.select %50, %51, %52 : index
      %54 = tensor.extract %transpose_1[%46, %47, %48, %53] : tensor<?x2x?x4xf32>
      %55 = arith.negf %54 : f32
      %56 = arith.select %50, %55, %54 : f32
      %57 = arith.mulf %42, %43 : f32
      %58 = arith.mulf %56, %44 : f32
      %59 = arith.addf %57, %58 : f32
      linalg.yield %59 : f32
    } -> tensor<?x2x?x4xf32>
    %linear_2_init_empty = tensor.empty(%batch, %seq) : tensor<?x?x8xf32>
    %linear_2_init = linalg.fill ins(%zero_f32 : f32) outs(%linear_2_init_empty : tensor<?x?x8xf32>) -> tensor<?x?x8xf32>
    %linear_2 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%rmsNorm, %wv : tensor<?x?x16xf32>, tensor<8x16xf32>) outs(%linear_2_init : tensor<?x?x8xf32>) {
    ^bb0(%60: f32, %61: f32, %62: f32):
      %63 = arith.mulf %60, %61 : f32
      %64 = arith.addf %62, %63 : f32
      linalg.yield %64 : f32
    } -> tensor<?x?x8xf32>
    %reshape_2 = tensor.expand_shape %linear_2 [[0], [1], [2, 3]] output_shape [%batch, %seq, 2, 4] : tensor<?x?x8xf32> into tensor<?x?x2x4xf32>
    %transpose_2_init = tensor.empty(%batch, %seq) : tensor<?x2x?x4xf32>
    %transpose_2 = linalg.transpose ins(%reshape_2 : tensor<?x?x2x4xf32>) outs(%transpose_2_init : tensor<?x2x?x4xf32>) permutation = [0, 2, 1, 3]
    %attention_dots_init_empty = tensor.empty(%batch, %seq, %seq) : tensor<?x4x?x?xf32>
    %attention_dots_init = linalg.fill ins(%zero_f32 : f32) outs(%attention_dots_init_empty : tensor<?x4x?x?xf32>) -> tensor<?x4x?x?xf32>
    %attention_dots = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1 floordiv 2, d3, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%rotary, %rotary_1 : tensor<?x4x?x4xf32>, tensor<?x2x?x4xf32>) outs(%attention_dots_init : tensor<?x4x?x?xf32>) {
    ^bb0(%65: f32, %66: f32, %67: f32):
      %68 = arith.mulf %65, %66 : f32
      %69 = arith.addf %67, %68 : f32
      linalg.yield %69 : f32
    } -> tensor<?x4x?x?xf32>
    %attention_scores_init = tensor.empty(%batch, %seq, %seq) : tensor<?x4x?x?xf32>
    %attention_scores = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, 0, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%attention_dots, %mask : tensor<?x4x?x?xf32>, tensor<?x1x1x?xf32>) outs(%attention_scores_init : tensor<?x4x?x?xf32>) {
    ^bb0(%70: f32, %71: f32, %72: f32):
      %73 = arith.mulf %70, %cst_f32_2 : f32
      %74 = arith.addf %73, %71 : f32
      %75 = linalg.index 2 : index
      %76 = linalg.index 3 : index
      %77 = arith.addi %75, %seq : index
      %78 = arith.subi %77, %seq : index
      %79 = arith.cmpi sle, %76, %78 : index
      %80 = arith.select %79, %74, %ninf_f32 : f32
      linalg.yield %80 : f32
    } -> tensor<?x4x?x?xf32>
    %attention_max_init_empty = tensor.empty(%batch, %seq) : tensor<?x4x?xf32>
    %attention_max_init = linalg.fill ins(%ninf_f32 : f32) outs(%attention_max_init_empty : tensor<?x4x?xf32>) -> tensor<?x4x?xf32>
    %attention_max = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%attention_scores : tensor<?x4x?x?xf32>) outs(%attention_max_init : tensor<?x4x?xf32>) {
    ^bb0(%81: f32, %82: f32):
      %83 = arith.maximumf %82, %81 : f32
      linalg.yield %83 : f32
    } -> tensor<?x4x?xf32>
    %attention_exp_init = tensor.empty(%batch, %seq, %seq) : tensor<?x4x?x?xf32>
    %attention_exp = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%attention_scores, %attention_max : tensor<?x4x?x?xf32>, tensor<?x4x?xf32>) outs(%attention_exp_init : tensor<?x4x?x?xf32>) {
    ^bb0(%84: f32, %85: f32, %86: f32):
      %87 = arith.subf %84, %85 : f32
      %88 = math.exp %87 : f32
      linalg.yield %88 : f32
    } -> tensor<?x4x?x?xf32>
    %attention_total_init_empty = tensor.empty(%batch, %seq) : tensor<?x4x?xf32>
    %attention_total_init = linalg.fill ins(%zero_f32 : f32) outs(%attention_total_init_empty : tensor<?x4x?xf32>) -> tensor<?x4x?xf32>
    %attention_total = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%attention_exp : tensor<?x4x?x?xf32>) outs(%attention_total_init : tensor<?x4x?xf32>) {
    ^bb0(%89: f32, %90: f32):
      %91 = arith.addf %90, %89 : f32
      linalg.yield %91 : f32
    } -> tensor<?x4x?xf32>
    %attention_sum_init_empty = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %attention_sum_init = linalg.fill ins(%zero_f32 : f32) outs(%attention_sum_init_empty : tensor<?x4x?x4xf32>) -> tensor<?x4x?x4xf32>
    %attention_sum = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1 floordiv 2, d4, d3)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%attention_exp, %transpose_2 : tensor<?x4x?x?xf32>, tensor<?x2x?x4xf32>) outs(%attention_sum_init : tensor<?x4x?x4xf32>) {
    ^bb0(%92: f32, %93: f32, %94: f32):
      %95 = arith.mulf %92, %93 : f32
      %96 = arith.addf %94, %95 : f32
      linalg.yield %96 : f32
    } -> tensor<?x4x?x4xf32>
    %attention_init = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %attention = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%attention_sum, %attention_total : tensor<?x4x?x4xf32>, tensor<?x4x?xf32>) outs(%attention_init : tensor<?x4x?x4xf32>) {
    ^bb0(%97: f32, %98: f32, %99: f32):
      %100 = arith.divf %97, %98 : f32
      linalg.yield %100 : f32
    } -> tensor<?x4x?x4xf32>
    %transpose_3_init = tensor.empty(%batch, %seq) : tensor<?x?x4x4xf32>
    %transpose_3 = linalg.transpose ins(%attention : tensor<?x4x?x4xf32>) outs(%transpose_3_init : tensor<?x?x4x4xf32>) permutation = [0, 2, 1, 3]
    %reshape_3 = tensor.collapse_shape %transpose_3 [[0], [1], [2, 3]] : tensor<?x?x4x4xf32> into tensor<?x?x16xf32>
    %linear_3_init_empty = tensor.empty(%batch, %seq) : tensor<?x?x16xf32>
    %linear_3_init = linalg.fill ins(%zero_f32 : f32) outs(%linear_3_init_empty : tensor<?x?x16xf32>) -> tensor<?x?x16xf32>
    %linear_3 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%reshape_3, %wo : tensor<?x?x16xf32>, tensor<16x16xf32>) outs(%linear_3_init : tensor<?x?x16xf32>) {
    ^bb0(%101: f32, %102: f32, %103: f32):
      %104 = arith.mulf %101, %102 : f32
      %105 = arith.addf %103, %104 : f32
      linalg.yield %105 : f32
    } -> tensor<?x?x16xf32>
    %add_init = tensor.empty(%batch, %seq) : tensor<?x?x16xf32>
    %add = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x, %linear_3 : tensor<?x?x16xf32>, tensor<?x?x16xf32>) outs(%add_init : tensor<?x?x16xf32>) {
    ^bb0(%106: f32, %107: f32, %108: f32):
      %109 = arith.addf %106, %107 : f32
      linalg.yield %109 : f32
    } -> tensor<?x?x16xf32>
    func.return %add : tensor<?x?x16xf32>
  }
}
