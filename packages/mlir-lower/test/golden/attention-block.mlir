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
    %rotary_slice = tensor.extract_slice %transpose[0, 0, 0, 2] [%batch, 4, %seq, 2] [1, 1, 1, 1] : tensor<?x4x?x4xf32> to tensor<?x4x?x2xf32>
    %rotary_neg_init = tensor.empty(%batch, %seq) : tensor<?x4x?x2xf32>
    %rotary_neg = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%rotary_slice : tensor<?x4x?x2xf32>) outs(%rotary_neg_init : tensor<?x4x?x2xf32>) {
    ^bb0(%19: f32, %20: f32):
      %21 = arith.negf %19 : f32
      linalg.yield %21 : f32
    } -> tensor<?x4x?x2xf32>
    %rotary_slice_1 = tensor.extract_slice %transpose[0, 0, 0, 0] [%batch, 4, %seq, 2] [1, 1, 1, 1] : tensor<?x4x?x4xf32> to tensor<?x4x?x2xf32>
    %rotary_concat_init = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %rotary_concat_part = tensor.insert_slice %rotary_neg into %rotary_concat_init[0, 0, 0, 0] [%batch, 4, %seq, 2] [1, 1, 1, 1] : tensor<?x4x?x2xf32> into tensor<?x4x?x4xf32>
    %rotary_concat = tensor.insert_slice %rotary_slice_1 into %rotary_concat_part[0, 0, 0, 2] [%batch, 4, %seq, 2] [1, 1, 1, 1] : tensor<?x4x?x2xf32> into tensor<?x4x?x4xf32>
    %rotary_mul_init = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %rotary_mul = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%transpose, %cos : tensor<?x4x?x4xf32>, tensor<?x1x?x4xf32>) outs(%rotary_mul_init : tensor<?x4x?x4xf32>) {
    ^bb0(%22: f32, %23: f32, %24: f32):
      %25 = arith.mulf %22, %23 : f32
      linalg.yield %25 : f32
    } -> tensor<?x4x?x4xf32>
    %rotary_mul_1_init = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %rotary_mul_1 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%rotary_concat, %sin : tensor<?x4x?x4xf32>, tensor<?x1x?x4xf32>) outs(%rotary_mul_1_init : tensor<?x4x?x4xf32>) {
    ^bb0(%26: f32, %27: f32, %28: f32):
      %29 = arith.mulf %26, %27 : f32
      linalg.yield %29 : f32
    } -> tensor<?x4x?x4xf32>
    %rotary_add_init = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %rotary_add = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%rotary_mul, %rotary_mul_1 : tensor<?x4x?x4xf32>, tensor<?x4x?x4xf32>) outs(%rotary_add_init : tensor<?x4x?x4xf32>) {
    ^bb0(%30: f32, %31: f32, %32: f32):
      %33 = arith.addf %30, %31 : f32
      linalg.yield %33 : f32
    } -> tensor<?x4x?x4xf32>
    %linear_1_init_empty = tensor.empty(%batch, %seq) : tensor<?x?x8xf32>
    %linear_1_init = linalg.fill ins(%zero_f32 : f32) outs(%linear_1_init_empty : tensor<?x?x8xf32>) -> tensor<?x?x8xf32>
    %linear_1 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%rmsNorm, %wk : tensor<?x?x16xf32>, tensor<8x16xf32>) outs(%linear_1_init : tensor<?x?x8xf32>) {
    ^bb0(%34: f32, %35: f32, %36: f32):
      %37 = arith.mulf %34, %35 : f32
      %38 = arith.addf %36, %37 : f32
      linalg.yield %38 : f32
    } -> tensor<?x?x8xf32>
    %reshape_1 = tensor.expand_shape %linear_1 [[0], [1], [2, 3]] output_shape [%batch, %seq, 2, 4] : tensor<?x?x8xf32> into tensor<?x?x2x4xf32>
    %transpose_1_init = tensor.empty(%batch, %seq) : tensor<?x2x?x4xf32>
    %transpose_1 = linalg.transpose ins(%reshape_1 : tensor<?x?x2x4xf32>) outs(%transpose_1_init : tensor<?x2x?x4xf32>) permutation = [0, 2, 1, 3]
    %rotary_1_slice = tensor.extract_slice %transpose_1[0, 0, 0, 2] [%batch, 2, %seq, 2] [1, 1, 1, 1] : tensor<?x2x?x4xf32> to tensor<?x2x?x2xf32>
    %rotary_1_neg_init = tensor.empty(%batch, %seq) : tensor<?x2x?x2xf32>
    %rotary_1_neg = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%rotary_1_slice : tensor<?x2x?x2xf32>) outs(%rotary_1_neg_init : tensor<?x2x?x2xf32>) {
    ^bb0(%39: f32, %40: f32):
      %41 = arith.negf %39 : f32
      linalg.yield %41 : f32
    } -> tensor<?x2x?x2xf32>
    %rotary_1_slice_1 = tensor.extract_slice %transpose_1[0, 0, 0, 0] [%batch, 2, %seq, 2] [1, 1, 1, 1] : tensor<?x2x?x4xf32> to tensor<?x2x?x2xf32>
    %rotary_1_concat_init = tensor.empty(%batch, %seq) : tensor<?x2x?x4xf32>
    %rotary_1_concat_part = tensor.insert_slice %rotary_1_neg into %rotary_1_concat_init[0, 0, 0, 0] [%batch, 2, %seq, 2] [1, 1, 1, 1] : tensor<?x2x?x2xf32> into tensor<?x2x?x4xf32>
    %rotary_1_concat = tensor.insert_slice %rotary_1_slice_1 into %rotary_1_concat_part[0, 0, 0, 2] [%batch, 2, %seq, 2] [1, 1, 1, 1] : tensor<?x2x?x2xf32> into tensor<?x2x?x4xf32>
    %rotary_1_mul_init = tensor.empty(%batch, %seq) : tensor<?x2x?x4xf32>
    %rotary_1_mul = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%transpose_1, %cos : tensor<?x2x?x4xf32>, tensor<?x1x?x4xf32>) outs(%rotary_1_mul_init : tensor<?x2x?x4xf32>) {
    ^bb0(%42: f32, %43: f32, %44: f32):
      %45 = arith.mulf %42, %43 : f32
      linalg.yield %45 : f32
    } -> tensor<?x2x?x4xf32>
    %rotary_1_mul_1_init = tensor.empty(%batch, %seq) : tensor<?x2x?x4xf32>
    %rotary_1_mul_1 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%rotary_1_concat, %sin : tensor<?x2x?x4xf32>, tensor<?x1x?x4xf32>) outs(%rotary_1_mul_1_init : tensor<?x2x?x4xf32>) {
    ^bb0(%46: f32, %47: f32, %48: f32):
      %49 = arith.mulf %46, %47 : f32
      linalg.yield %49 : f32
    } -> tensor<?x2x?x4xf32>
    %rotary_1_add_init = tensor.empty(%batch, %seq) : tensor<?x2x?x4xf32>
    %rotary_1_add = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%rotary_1_mul, %rotary_1_mul_1 : tensor<?x2x?x4xf32>, tensor<?x2x?x4xf32>) outs(%rotary_1_add_init : tensor<?x2x?x4xf32>) {
    ^bb0(%50: f32, %51: f32, %52: f32):
      %53 = arith.addf %50, %51 : f32
      linalg.yield %53 : f32
    } -> tensor<?x2x?x4xf32>
    %linear_2_init_empty = tensor.empty(%batch, %seq) : tensor<?x?x8xf32>
    %linear_2_init = linalg.fill ins(%zero_f32 : f32) outs(%linear_2_init_empty : tensor<?x?x8xf32>) -> tensor<?x?x8xf32>
    %linear_2 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%rmsNorm, %wv : tensor<?x?x16xf32>, tensor<8x16xf32>) outs(%linear_2_init : tensor<?x?x8xf32>) {
    ^bb0(%54: f32, %55: f32, %56: f32):
      %57 = arith.mulf %54, %55 : f32
      %58 = arith.addf %56, %57 : f32
      linalg.yield %58 : f32
    } -> tensor<?x?x8xf32>
    %reshape_2 = tensor.expand_shape %linear_2 [[0], [1], [2, 3]] output_shape [%batch, %seq, 2, 4] : tensor<?x?x8xf32> into tensor<?x?x2x4xf32>
    %transpose_2_init = tensor.empty(%batch, %seq) : tensor<?x2x?x4xf32>
    %transpose_2 = linalg.transpose ins(%reshape_2 : tensor<?x?x2x4xf32>) outs(%transpose_2_init : tensor<?x2x?x4xf32>) permutation = [0, 2, 1, 3]
    %attention_dots_init_empty = tensor.empty(%batch, %seq, %seq) : tensor<?x4x?x?xf32>
    %attention_dots_init = linalg.fill ins(%zero_f32 : f32) outs(%attention_dots_init_empty : tensor<?x4x?x?xf32>) -> tensor<?x4x?x?xf32>
    %attention_dots = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1 floordiv 2, d3, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%rotary_add, %rotary_1_add : tensor<?x4x?x4xf32>, tensor<?x2x?x4xf32>) outs(%attention_dots_init : tensor<?x4x?x?xf32>) {
    ^bb0(%59: f32, %60: f32, %61: f32):
      %62 = arith.mulf %59, %60 : f32
      %63 = arith.addf %61, %62 : f32
      linalg.yield %63 : f32
    } -> tensor<?x4x?x?xf32>
    %attention_scores_init = tensor.empty(%batch, %seq, %seq) : tensor<?x4x?x?xf32>
    %attention_scores = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, 0, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%attention_dots, %mask : tensor<?x4x?x?xf32>, tensor<?x1x1x?xf32>) outs(%attention_scores_init : tensor<?x4x?x?xf32>) {
    ^bb0(%64: f32, %65: f32, %66: f32):
      %67 = arith.mulf %64, %cst_f32_2 : f32
      %68 = arith.addf %67, %65 : f32
      %69 = linalg.index 2 : index
      %70 = linalg.index 3 : index
      %71 = arith.addi %69, %seq : index
      %72 = arith.subi %71, %seq : index
      %73 = arith.cmpi sle, %70, %72 : index
      %74 = arith.select %73, %68, %ninf_f32 : f32
      linalg.yield %74 : f32
    } -> tensor<?x4x?x?xf32>
    %attention_max_init_empty = tensor.empty(%batch, %seq) : tensor<?x4x?xf32>
    %attention_max_init = linalg.fill ins(%ninf_f32 : f32) outs(%attention_max_init_empty : tensor<?x4x?xf32>) -> tensor<?x4x?xf32>
    %attention_max = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%attention_scores : tensor<?x4x?x?xf32>) outs(%attention_max_init : tensor<?x4x?xf32>) {
    ^bb0(%75: f32, %76: f32):
      %77 = arith.maximumf %76, %75 : f32
      linalg.yield %77 : f32
    } -> tensor<?x4x?xf32>
    %attention_exp_init = tensor.empty(%batch, %seq, %seq) : tensor<?x4x?x?xf32>
    %attention_exp = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%attention_scores, %attention_max : tensor<?x4x?x?xf32>, tensor<?x4x?xf32>) outs(%attention_exp_init : tensor<?x4x?x?xf32>) {
    ^bb0(%78: f32, %79: f32, %80: f32):
      %81 = arith.subf %78, %79 : f32
      %82 = math.exp %81 : f32
      linalg.yield %82 : f32
    } -> tensor<?x4x?x?xf32>
    %attention_total_init_empty = tensor.empty(%batch, %seq) : tensor<?x4x?xf32>
    %attention_total_init = linalg.fill ins(%zero_f32 : f32) outs(%attention_total_init_empty : tensor<?x4x?xf32>) -> tensor<?x4x?xf32>
    %attention_total = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%attention_exp : tensor<?x4x?x?xf32>) outs(%attention_total_init : tensor<?x4x?xf32>) {
    ^bb0(%83: f32, %84: f32):
      %85 = arith.addf %84, %83 : f32
      linalg.yield %85 : f32
    } -> tensor<?x4x?xf32>
    %attention_sum_init_empty = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %attention_sum_init = linalg.fill ins(%zero_f32 : f32) outs(%attention_sum_init_empty : tensor<?x4x?x4xf32>) -> tensor<?x4x?x4xf32>
    %attention_sum = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d4)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1 floordiv 2, d4, d3)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]} ins(%attention_exp, %transpose_2 : tensor<?x4x?x?xf32>, tensor<?x2x?x4xf32>) outs(%attention_sum_init : tensor<?x4x?x4xf32>) {
    ^bb0(%86: f32, %87: f32, %88: f32):
      %89 = arith.mulf %86, %87 : f32
      %90 = arith.addf %88, %89 : f32
      linalg.yield %90 : f32
    } -> tensor<?x4x?x4xf32>
    %attention_init = tensor.empty(%batch, %seq) : tensor<?x4x?x4xf32>
    %attention = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%attention_sum, %attention_total : tensor<?x4x?x4xf32>, tensor<?x4x?xf32>) outs(%attention_init : tensor<?x4x?x4xf32>) {
    ^bb0(%91: f32, %92: f32, %93: f32):
      %94 = arith.divf %91, %92 : f32
      linalg.yield %94 : f32
    } -> tensor<?x4x?x4xf32>
    %transpose_3_init = tensor.empty(%batch, %seq) : tensor<?x?x4x4xf32>
    %transpose_3 = linalg.transpose ins(%attention : tensor<?x4x?x4xf32>) outs(%transpose_3_init : tensor<?x?x4x4xf32>) permutation = [0, 2, 1, 3]
    %reshape_3 = tensor.collapse_shape %transpose_3 [[0], [1], [2, 3]] : tensor<?x?x4x4xf32> into tensor<?x?x16xf32>
    %linear_3_init_empty = tensor.empty(%batch, %seq) : tensor<?x?x16xf32>
    %linear_3_init = linalg.fill ins(%zero_f32 : f32) outs(%linear_3_init_empty : tensor<?x?x16xf32>) -> tensor<?x?x16xf32>
    %linear_3 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>, affine_map<(d0, d1, d2, d3) -> (d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%reshape_3, %wo : tensor<?x?x16xf32>, tensor<16x16xf32>) outs(%linear_3_init : tensor<?x?x16xf32>) {
    ^bb0(%95: f32, %96: f32, %97: f32):
      %98 = arith.mulf %95, %96 : f32
      %99 = arith.addf %97, %98 : f32
      linalg.yield %99 : f32
    } -> tensor<?x?x16xf32>
    %add_init = tensor.empty(%batch, %seq) : tensor<?x?x16xf32>
    %add = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x, %linear_3 : tensor<?x?x16xf32>, tensor<?x?x16xf32>) outs(%add_init : tensor<?x?x16xf32>) {
    ^bb0(%100: f32, %101: f32, %102: f32):
      %103 = arith.addf %100, %101 : f32
      linalg.yield %103 : f32
    } -> tensor<?x?x16xf32>
    func.return %add : tensor<?x?x16xf32>
  }
}
