// StageML graph @dynamic_shapes lowered by @stageml/mlir-lower (func, arith, math, linalg, tensor, scf; MLIR 19).
// Arguments: 1 inputs, 0 parameters; 0 resource blobs.
// Verify: mlir-opt-19 --verify-each FILE -o /dev/null
module {
  func.func @dynamic_shapes(%x: tensor<?x6xf32> {stageml.input = "x"}) -> (tensor<?xf32> {stageml.output = "flat"}, tensor<2x3x?xf32> {stageml.output = "odd"}, tensor<?x6xf32> {stageml.output = "both"}, tensor<2x6xf32> {stageml.output = "top"}, tensor<2x6xi64> {stageml.output = "at"}, tensor<?x1xf32> {stageml.output = "rowmax"}) {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?x6xf32>
    %c2 = arith.constant 2 : index
    %c3 = arith.constant 3 : index
    %c1 = arith.constant 1 : index
    %0 = arith.subi %n, %c1 : index
    %1 = arith.muli %n, %c2 : index
    %2 = arith.subi %1, %c1 : index
    %zero_i64 = arith.constant 0 : i64
    %inf_f32 = arith.constant 0x7F800000 : f32
    %zero_f32 = arith.constant 0.0 : f32
    %ninf_f32 = arith.constant 0xFF800000 : f32
    %reshape = tensor.expand_shape %x [[0], [1, 2]] output_shape [%n, 2, 3] : tensor<?x6xf32> into tensor<?x2x3xf32>
    %reshape_1 = tensor.collapse_shape %reshape [[0, 1, 2]] : tensor<?x2x3xf32> into tensor<?xf32>
    %reshape_2_shape = tensor.from_elements %c2, %c3, %n : tensor<3xindex>
    %reshape_2 = tensor.reshape %x(%reshape_2_shape) : (tensor<?x6xf32>, tensor<3xindex>) -> tensor<2x3x?xf32>
    %slice = tensor.extract_slice %x[1, 0] [%0, 6] [1, 1] : tensor<?x6xf32> to tensor<?x6xf32>
    %concat_init = tensor.empty(%2) : tensor<?x6xf32>
    %concat_part = tensor.insert_slice %x into %concat_init[0, 0] [%n, 6] [1, 1] : tensor<?x6xf32> into tensor<?x6xf32>
    %concat = tensor.insert_slice %slice into %concat_part[%n, 0] [%0, 6] [1, 1] : tensor<?x6xf32> into tensor<?x6xf32>
    %iota_init = tensor.empty(%n) : tensor<?x6xi64>
    %iota = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} outs(%iota_init : tensor<?x6xi64>) {
    ^bb0(%3: i64):
      %4 = linalg.index 0 : index
      %5 = arith.index_cast %4 : index to i64
      linalg.yield %5 : i64
    } -> tensor<?x6xi64>
    %cast_init = tensor.empty(%n) : tensor<?x6xf32>
    %cast = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%iota : tensor<?x6xi64>) outs(%cast_init : tensor<?x6xf32>) {
    ^bb0(%6: i64, %7: f32):
      %8 = arith.sitofp %6 : i64 to f32
      linalg.yield %8 : f32
    } -> tensor<?x6xf32>
    %add_init = tensor.empty(%n) : tensor<?x6xf32>
    %add = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%x, %cast : tensor<?x6xf32>, tensor<?x6xf32>) outs(%add_init : tensor<?x6xf32>) {
    ^bb0(%9: f32, %10: f32, %11: f32):
      %12 = arith.addf %9, %10 : f32
      linalg.yield %12 : f32
    } -> tensor<?x6xf32>
    %topk.0_rank_init_empty = tensor.empty(%n) : tensor<?x6xi64>
    %topk.0_rank_init = linalg.fill ins(%zero_i64 : i64) outs(%topk.0_rank_init_empty : tensor<?x6xi64>) -> tensor<?x6xi64>
    %topk.0_rank = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1)>, affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%add, %add : tensor<?x6xf32>, tensor<?x6xf32>) outs(%topk.0_rank_init : tensor<?x6xi64>) {
    ^bb0(%13: f32, %14: f32, %15: i64):
      %16 = linalg.index 2 : index
      %17 = linalg.index 0 : index
      %18 = arith.cmpi ult, %16, %17 : index
      %19 = arith.cmpf uno, %14, %14 : f32
      %20 = arith.cmpf uno, %13, %13 : f32
      %21 = arith.select %19, %inf_f32, %14 : f32
      %22 = arith.select %20, %inf_f32, %13 : f32
      %23 = arith.cmpf ogt, %21, %22 : f32
      %24 = arith.cmpf oeq, %21, %22 : f32
      %25 = arith.cmpi ugt, %19, %20 : i1
      %26 = arith.cmpi eq, %19, %20 : i1
      %27 = arith.andi %24, %25 : i1
      %28 = arith.andi %24, %26 : i1
      %29 = arith.andi %28, %18 : i1
      %30 = arith.ori %23, %27 : i1
      %31 = arith.ori %30, %29 : i1
      %32 = arith.extui %31 : i1 to i64
      %33 = arith.addi %15, %32 : i64
      linalg.yield %33 : i64
    } -> tensor<?x6xi64>
    %topk.0_init_empty = tensor.empty() : tensor<2x6xf32>
    %topk.0_init = linalg.fill ins(%zero_f32 : f32) outs(%topk.0_init_empty : tensor<2x6xf32>) -> tensor<2x6xf32>
    %topk.1_init_empty = tensor.empty() : tensor<2x6xi64>
    %topk.1_init = linalg.fill ins(%zero_i64 : i64) outs(%topk.1_init_empty : tensor<2x6xi64>) -> tensor<2x6xi64>
    %topk.0:2 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%add, %topk.0_rank : tensor<?x6xf32>, tensor<?x6xi64>) outs(%topk.0_init, %topk.1_init : tensor<2x6xf32>, tensor<2x6xi64>) {
    ^bb0(%34: f32, %35: i64, %36: f32, %37: i64):
      %38 = linalg.index 0 : index
      %39 = arith.index_cast %38 : index to i64
      %40 = arith.cmpi eq, %35, %39 : i64
      %41 = linalg.index 2 : index
      %42 = arith.index_cast %41 : index to i64
      %43 = arith.select %40, %34, %36 : f32
      %44 = arith.select %40, %42, %37 : i64
      linalg.yield %43, %44 : f32, i64
    } -> (tensor<2x6xf32>, tensor<2x6xi64>)
    %softmax_max_init_empty = tensor.empty() : tensor<6xf32>
    %softmax_max_init = linalg.fill ins(%ninf_f32 : f32) outs(%softmax_max_init_empty : tensor<6xf32>) -> tensor<6xf32>
    %softmax_max = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>], iterator_types = ["reduction", "parallel"]} ins(%x : tensor<?x6xf32>) outs(%softmax_max_init : tensor<6xf32>) {
    ^bb0(%45: f32, %46: f32):
      %47 = arith.maximumf %46, %45 : f32
      linalg.yield %47 : f32
    } -> tensor<6xf32>
    %softmax_exp_init = tensor.empty(%n) : tensor<?x6xf32>
    %softmax_exp = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%x, %softmax_max : tensor<?x6xf32>, tensor<6xf32>) outs(%softmax_exp_init : tensor<?x6xf32>) {
    ^bb0(%48: f32, %49: f32, %50: f32):
      %51 = arith.subf %48, %49 : f32
      %52 = math.exp %51 : f32
      linalg.yield %52 : f32
    } -> tensor<?x6xf32>
    %softmax_sum_init_empty = tensor.empty() : tensor<6xf32>
    %softmax_sum_init = linalg.fill ins(%zero_f32 : f32) outs(%softmax_sum_init_empty : tensor<6xf32>) -> tensor<6xf32>
    %softmax_sum = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>], iterator_types = ["reduction", "parallel"]} ins(%softmax_exp : tensor<?x6xf32>) outs(%softmax_sum_init : tensor<6xf32>) {
    ^bb0(%53: f32, %54: f32):
      %55 = arith.addf %54, %53 : f32
      linalg.yield %55 : f32
    } -> tensor<6xf32>
    %softmax_init = tensor.empty(%n) : tensor<?x6xf32>
    %softmax = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%softmax_exp, %softmax_sum : tensor<?x6xf32>, tensor<6xf32>) outs(%softmax_init : tensor<?x6xf32>) {
    ^bb0(%56: f32, %57: f32, %58: f32):
      %59 = arith.divf %56, %57 : f32
      linalg.yield %59 : f32
    } -> tensor<?x6xf32>
    %max_init_empty = tensor.empty(%n) : tensor<?xf32>
    %max_init = linalg.fill ins(%ninf_f32 : f32) outs(%max_init_empty : tensor<?xf32>) -> tensor<?xf32>
    %max = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%softmax : tensor<?x6xf32>) outs(%max_init : tensor<?xf32>) {
    ^bb0(%60: f32, %61: f32):
      %62 = arith.maximumf %61, %60 : f32
      linalg.yield %62 : f32
    } -> tensor<?xf32>
    %max_1 = tensor.expand_shape %max [[0, 1]] output_shape [%n, 1] : tensor<?xf32> into tensor<?x1xf32>
    func.return %reshape_1, %reshape_2, %concat, %topk.0#0, %topk.0#1, %max_1 : tensor<?xf32>, tensor<2x3x?xf32>, tensor<?x6xf32>, tensor<2x6xf32>, tensor<2x6xi64>, tensor<?x1xf32>
  }
}
