// StageML graph @moe_layer lowered by @stageml/mlir-lower (func, arith, math, linalg, tensor, scf; MLIR 19).
// Arguments: 1 inputs, 0 parameters; 3 resource blobs.
// Verify: mlir-opt-19 --verify-each FILE -o /dev/null
module {
  func.func @moe_layer(%x: tensor<?x8xf32> {stageml.input = "x"}) -> (tensor<?x8xf32> {stageml.output = "y"}) {
    %c0 = arith.constant 0 : index
    %tokens = tensor.dim %x, %c0 : tensor<?x8xf32>
    %zero_f32 = arith.constant 0.0 : f32
    %ninf_f32 = arith.constant 0xFF800000 : f32
    %zero_i64 = arith.constant 0 : i64
    %inf_f32 = arith.constant 0x7F800000 : f32
    %c2 = arith.constant 2 : index
    %57 = arith.muli %tokens, %c2 : index
    %one_f32 = arith.constant 1.0 : f32
    %c1 = arith.constant 1 : index
    %router = arith.constant dense_resource<moe_layer_router> : tensor<4x8xf32>
    %gate_up = arith.constant dense_resource<moe_layer_gate_up> : tensor<4x12x8xf32>
    %down = arith.constant dense_resource<moe_layer_down> : tensor<4x8x6xf32>
    %linear_init_empty = tensor.empty(%tokens) : tensor<?x4xf32>
    %linear_init = linalg.fill ins(%zero_f32 : f32) outs(%linear_init_empty : tensor<?x4xf32>) -> tensor<?x4xf32>
    %linear = linalg.matmul_transpose_b ins(%x, %router : tensor<?x8xf32>, tensor<4x8xf32>) outs(%linear_init : tensor<?x4xf32>) -> tensor<?x4xf32>
    %softmax_max_init_empty = tensor.empty(%tokens) : tensor<?xf32>
    %softmax_max_init = linalg.fill ins(%ninf_f32 : f32) outs(%softmax_max_init_empty : tensor<?xf32>) -> tensor<?xf32>
    %softmax_max = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%linear : tensor<?x4xf32>) outs(%softmax_max_init : tensor<?xf32>) {
    ^bb0(%0: f32, %1: f32):
      %2 = arith.maximumf %1, %0 : f32
      linalg.yield %2 : f32
    } -> tensor<?xf32>
    %softmax_exp_init = tensor.empty(%tokens) : tensor<?x4xf32>
    %softmax_exp = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%linear, %softmax_max : tensor<?x4xf32>, tensor<?xf32>) outs(%softmax_exp_init : tensor<?x4xf32>) {
    ^bb0(%3: f32, %4: f32, %5: f32):
      %6 = arith.subf %3, %4 : f32
      %7 = math.exp %6 : f32
      linalg.yield %7 : f32
    } -> tensor<?x4xf32>
    %softmax_sum_init_empty = tensor.empty(%tokens) : tensor<?xf32>
    %softmax_sum_init = linalg.fill ins(%zero_f32 : f32) outs(%softmax_sum_init_empty : tensor<?xf32>) -> tensor<?xf32>
    %softmax_sum = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%softmax_exp : tensor<?x4xf32>) outs(%softmax_sum_init : tensor<?xf32>) {
    ^bb0(%8: f32, %9: f32):
      %10 = arith.addf %9, %8 : f32
      linalg.yield %10 : f32
    } -> tensor<?xf32>
    %softmax_init = tensor.empty(%tokens) : tensor<?x4xf32>
    %softmax = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%softmax_exp, %softmax_sum : tensor<?x4xf32>, tensor<?xf32>) outs(%softmax_init : tensor<?x4xf32>) {
    ^bb0(%11: f32, %12: f32, %13: f32):
      %14 = arith.divf %11, %12 : f32
      linalg.yield %14 : f32
    } -> tensor<?x4xf32>
    %topk.0_rank_init_empty = tensor.empty(%tokens) : tensor<?x4xi64>
    %topk.0_rank_init = linalg.fill ins(%zero_i64 : i64) outs(%topk.0_rank_init_empty : tensor<?x4xi64>) -> tensor<?x4xi64>
    %topk.0_rank = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1)>, affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%softmax, %softmax : tensor<?x4xf32>, tensor<?x4xf32>) outs(%topk.0_rank_init : tensor<?x4xi64>) {
    ^bb0(%15: f32, %16: f32, %17: i64):
      %18 = linalg.index 2 : index
      %19 = linalg.index 1 : index
      %20 = arith.cmpi ult, %18, %19 : index
      %21 = arith.cmpf uno, %16, %16 : f32
      %22 = arith.cmpf uno, %15, %15 : f32
      %23 = arith.select %21, %inf_f32, %16 : f32
      %24 = arith.select %22, %inf_f32, %15 : f32
      %25 = arith.cmpf ogt, %23, %24 : f32
      %26 = arith.cmpf oeq, %23, %24 : f32
      %27 = arith.cmpi ugt, %21, %22 : i1
      %28 = arith.cmpi eq, %21, %22 : i1
      %29 = arith.andi %26, %27 : i1
      %30 = arith.andi %26, %28 : i1
      %31 = arith.andi %30, %20 : i1
      %32 = arith.ori %25, %29 : i1
      %33 = arith.ori %32, %31 : i1
      %34 = arith.extui %33 : i1 to i64
      %35 = arith.addi %17, %34 : i64
      linalg.yield %35 : i64
    } -> tensor<?x4xi64>
    %topk.0_init_empty = tensor.empty(%tokens) : tensor<?x2xf32>
    %topk.0_init = linalg.fill ins(%zero_f32 : f32) outs(%topk.0_init_empty : tensor<?x2xf32>) -> tensor<?x2xf32>
    %topk.1_init_empty = tensor.empty(%tokens) : tensor<?x2xi64>
    %topk.1_init = linalg.fill ins(%zero_i64 : i64) outs(%topk.1_init_empty : tensor<?x2xi64>) -> tensor<?x2xi64>
    %topk.0:2 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%softmax, %topk.0_rank : tensor<?x4xf32>, tensor<?x4xi64>) outs(%topk.0_init, %topk.1_init : tensor<?x2xf32>, tensor<?x2xi64>) {
    ^bb0(%36: f32, %37: i64, %38: f32, %39: i64):
      %40 = linalg.index 1 : index
      %41 = arith.index_cast %40 : index to i64
      %42 = arith.cmpi eq, %37, %41 : i64
      %43 = linalg.index 2 : index
      %44 = arith.index_cast %43 : index to i64
      %45 = arith.select %42, %36, %38 : f32
      %46 = arith.select %42, %44, %39 : i64
      linalg.yield %45, %46 : f32, i64
    } -> (tensor<?x2xf32>, tensor<?x2xi64>)
    %sum_init_empty = tensor.empty(%tokens) : tensor<?xf32>
    %sum_init = linalg.fill ins(%zero_f32 : f32) outs(%sum_init_empty : tensor<?xf32>) -> tensor<?xf32>
    %sum = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%topk.0#0 : tensor<?x2xf32>) outs(%sum_init : tensor<?xf32>) {
    ^bb0(%47: f32, %48: f32):
      %49 = arith.addf %48, %47 : f32
      linalg.yield %49 : f32
    } -> tensor<?xf32>
    %sum_1 = tensor.expand_shape %sum [[0, 1]] output_shape [%tokens, 1] : tensor<?xf32> into tensor<?x1xf32>
    %div_init = tensor.empty(%tokens) : tensor<?x2xf32>
    %div = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, 0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%topk.0#0, %sum_1 : tensor<?x2xf32>, tensor<?x1xf32>) outs(%div_init : tensor<?x2xf32>) {
    ^bb0(%50: f32, %51: f32, %52: f32):
      %53 = arith.divf %50, %51 : f32
      linalg.yield %53 : f32
    } -> tensor<?x2xf32>
    %reshape = tensor.collapse_shape %topk.0#1 [[0, 1]] : tensor<?x2xi64> into tensor<?xi64>
    %iota_init = tensor.empty(%tokens) : tensor<?x2xi64>
    %iota = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} outs(%iota_init : tensor<?x2xi64>) {
    ^bb0(%54: i64):
      %55 = linalg.index 0 : index
      %56 = arith.index_cast %55 : index to i64
      linalg.yield %56 : i64
    } -> tensor<?x2xi64>
    %reshape_1 = tensor.collapse_shape %iota [[0, 1]] : tensor<?x2xi64> into tensor<?xi64>
    %gather_init = tensor.empty(%57) : tensor<?x8xf32>
    %gather = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%reshape_1 : tensor<?xi64>) outs(%gather_init : tensor<?x8xf32>) {
    ^bb0(%58: i64, %59: f32):
      %60 = arith.index_cast %58 : i64 to index
      %61 = linalg.index 1 : index
      %62 = tensor.extract %x[%60, %61] : tensor<?x8xf32>
      linalg.yield %62 : f32
    } -> tensor<?x8xf32>
    %groupedMatmul_init_empty = tensor.empty(%57) : tensor<?x12xf32>
    %groupedMatmul_init = linalg.fill ins(%zero_f32 : f32) outs(%groupedMatmul_init_empty : tensor<?x12xf32>) -> tensor<?x12xf32>
    %groupedMatmul = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d0)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%gather, %reshape : tensor<?x8xf32>, tensor<?xi64>) outs(%groupedMatmul_init : tensor<?x12xf32>) {
    ^bb0(%63: f32, %64: i64, %65: f32):
      %66 = arith.index_cast %64 : i64 to index
      %67 = linalg.index 1 : index
      %68 = linalg.index 2 : index
      %69 = tensor.extract %gate_up[%66, %67, %68] : tensor<4x12x8xf32>
      %70 = arith.mulf %63, %69 : f32
      %71 = arith.addf %65, %70 : f32
      linalg.yield %71 : f32
    } -> tensor<?x12xf32>
    %slice = tensor.extract_slice %groupedMatmul[0, 0] [%57, 6] [1, 1] : tensor<?x12xf32> to tensor<?x6xf32>
    %slice_1 = tensor.extract_slice %groupedMatmul[0, 6] [%57, 6] [1, 1] : tensor<?x12xf32> to tensor<?x6xf32>
    %silu_init = tensor.empty(%57) : tensor<?x6xf32>
    %silu = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%slice : tensor<?x6xf32>) outs(%silu_init : tensor<?x6xf32>) {
    ^bb0(%72: f32, %73: f32):
      %74 = arith.negf %72 : f32
      %75 = math.exp %74 : f32
      %76 = arith.addf %75, %one_f32 : f32
      %77 = arith.divf %one_f32, %76 : f32
      %78 = arith.mulf %72, %77 : f32
      linalg.yield %78 : f32
    } -> tensor<?x6xf32>
    %mul_init = tensor.empty(%57) : tensor<?x6xf32>
    %mul = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%silu, %slice_1 : tensor<?x6xf32>, tensor<?x6xf32>) outs(%mul_init : tensor<?x6xf32>) {
    ^bb0(%79: f32, %80: f32, %81: f32):
      %82 = arith.mulf %79, %80 : f32
      linalg.yield %82 : f32
    } -> tensor<?x6xf32>
    %groupedMatmul_1_init_empty = tensor.empty(%57) : tensor<?x8xf32>
    %groupedMatmul_1_init = linalg.fill ins(%zero_f32 : f32) outs(%groupedMatmul_1_init_empty : tensor<?x8xf32>) -> tensor<?x8xf32>
    %groupedMatmul_1 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d0)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%mul, %reshape : tensor<?x6xf32>, tensor<?xi64>) outs(%groupedMatmul_1_init : tensor<?x8xf32>) {
    ^bb0(%83: f32, %84: i64, %85: f32):
      %86 = arith.index_cast %84 : i64 to index
      %87 = linalg.index 1 : index
      %88 = linalg.index 2 : index
      %89 = tensor.extract %down[%86, %87, %88] : tensor<4x8x6xf32>
      %90 = arith.mulf %83, %89 : f32
      %91 = arith.addf %85, %90 : f32
      linalg.yield %91 : f32
    } -> tensor<?x8xf32>
    %reshape_2_flat = tensor.collapse_shape %div [[0, 1]] : tensor<?x2xf32> into tensor<?xf32>
    %reshape_2 = tensor.expand_shape %reshape_2_flat [[0, 1]] output_shape [%57, 1] : tensor<?xf32> into tensor<?x1xf32>
    %mul_1_init = tensor.empty(%57) : tensor<?x8xf32>
    %mul_1 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, 0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%groupedMatmul_1, %reshape_2 : tensor<?x8xf32>, tensor<?x1xf32>) outs(%mul_1_init : tensor<?x8xf32>) {
    ^bb0(%92: f32, %93: f32, %94: f32):
      %95 = arith.mulf %92, %93 : f32
      linalg.yield %95 : f32
    } -> tensor<?x8xf32>
    %constant = arith.constant dense<0.0> : tensor<f32>
    %broadcastTo_init = tensor.empty(%tokens) : tensor<?x8xf32>
    %broadcastTo = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> ()>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%constant : tensor<f32>) outs(%broadcastTo_init : tensor<?x8xf32>) {
    ^bb0(%96: f32, %97: f32):
      linalg.yield %96 : f32
    } -> tensor<?x8xf32>
    %scatterAdd = scf.for %98 = %c0 to %57 step %c1 iter_args(%99 = %broadcastTo) -> (tensor<?x8xf32>) {
      %100 = tensor.extract %reshape_1[%98] : tensor<?xi64>
      %101 = arith.index_cast %100 : i64 to index
      %102 = tensor.extract_slice %mul_1[%98, 0] [1, 8] [1, 1] : tensor<?x8xf32> to tensor<1x8xf32>
      %103 = tensor.extract_slice %99[%101, 0] [1, 8] [1, 1] : tensor<?x8xf32> to tensor<1x8xf32>
      %scatterAdd_step = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%102 : tensor<1x8xf32>) outs(%103 : tensor<1x8xf32>) {
      ^bb0(%104: f32, %105: f32):
        %106 = arith.addf %105, %104 : f32
        linalg.yield %106 : f32
      } -> tensor<1x8xf32>
      %107 = tensor.insert_slice %scatterAdd_step into %99[%101, 0] [1, 8] [1, 1] : tensor<1x8xf32> into tensor<?x8xf32>
      scf.yield %107 : tensor<?x8xf32>
    }
    func.return %scatterAdd : tensor<?x8xf32>
  }
}
{-#
  dialect_resources: {
    builtin: {
      moe_layer_router: "0x040000000000000021FC2F3EE43E903E0A78943E1347463E94C8E03C803718BE2BD08ABE8D7297BE7CE85ABE5ED75FBD6158FE3D8A37843E0A28993E17B46D3E07B5A63DE61FCABD4D0679BED59499BE8D817EBE9818DCBDA235943D1587673E04B8983E6796863EE7D1073E941A3ABDFA1654BE729396BE30CB8CBE057420BEF974943C",
      moe_layer_gate_up: "0x04000000FC3F813E637B993E75B4743E135CBC3DF0A1B4BD263C72BEA76399BE3B5582BE5B0FF1BD7C537C3D75F05F3EB902983E8538893EA4DE113E93450DBD2AC44BBE8E5B95BE50F58EBE8DFC29BEC343E83B8EE2353ED973913E4D7F933EA5AD403EE2E5A63C997A1EBEFB538CBEBDCC96BE3AC155BE423B43BD86BE053EF206863E89D6983E0F0A693E4BB0983DD6C6D7BD8C347DBE539899BEC25E7ABE437BCEBD8841A23DCA3B6C3E7A10993E10CD843E8C45013E04C056BD0A4859BE224097BEBD4D8BBE08381ABE2960CE3CF981443E2F2B943E73A3903E8ADF313EF7D4133B2D162EBE3ED88FBEBFC294BE4E0948BEBE2DF3BCC434163E97508A3EC8A2973EC4855C3E7CEB683DFB21FABD19A083BE633D99BEF4286FBE1C26ABBD9DC1C53D3DAA773E1D8F993EE0CA7F3E2B67E03DD5B88FBDC10066BE499798BEEA2387BE50E309BE35F7303DA869523EFA57963E5C408D3E1E6B223EEB0182BCFB0E3DBE02D692BEA92D92BE599639BE2F033EBC8F1E263EE9188E3E3FE1953E48334F3E9A9C1F3DA0C90DBEDA2A88BE2A5398BE891363BEEE3087BDCA88E83D8F18813E2D7E993E740C753E6C71BD3D468BB3BD6BE271BEC55F99BEBB7B82BE571BF2BDDF187A3D9A8C5F3E33F8973E3359893ED55E123E73020BBD04574BBE7C4A95BEE70F8FBEDD752ABE8F0DD63B096D353E5E5C913E9293933E101F413EF870AB3CB0FD1DBE4A368CBE85DA96BECC2956BEB27A45BD453B053E4BE3853EB8DD983EE968693E8BCA993DD8B5D6BDEAE17CBED89899BE17B37ABEAF8DCFBD5928A13D86DE6B3E540A993E9EF1843EB1C9013EF78154BDECE058BE5E3397BE606C8BBE00B61ABE56D6C93CDF11443EE917943EE9BB903E4756323E7243383B079E2DBEA0BE8FBED4D494BED17748BEC4B5F7BC93B5153ED8308A3E54AE973E20EB5C3EBD276B3DA817F9BD7C7A83BE4E4299BE50846FBEF63DACBD93ADC43DE853773E5D8D993EBC0D803E6576E13D649D8EBD0DA065BEE28E98BE7D4687BE7B650ABE48B62E3D62FF513EFD48963EEC5C8D3EBEE6223E49EB7ABC089C3CBE8FC092BEF94392BE660A3ABE0F1D47BCE7A3253E2EFD8D3E1EF1953EC89E4F3E85DE213D48480DBE130988BE785C98BE967563BE314D88BDE77AE73D05F1803ED480993E3B64753E9986BE3D7574B2BD798871BEC05B99BE1EA282BE1D27F3BD09DE773D8B285F3E8BED973EC379893EE5DE123E34BF08BDB0E94ABE473995BE5D2A8FBE07EF2ABE2AD7C33B5AF7343EC244913EB6A7933E5090413EE7FBAF3CA3801DBE79188CBE2CE896BE2F9256BEF5B947BDE6B7043E86BF853EC4E4983E8EC7693EA9E49A3DAAA4D5BD108F7CBE3A9999BE34077BBEEB9FD0BD050FA03D0D816B3E0C04993E0E16853EB94D023EBB4352BD9E7958BE792697BEE48A8BBED5331BBE554CC53C99A1433E8304943E3ED4903EDCCC323EC4B15C3BBA252DBEE2A48FBEC7E694BE28E648BE923DFCBC4136153EF9108A3EBFB9973E4B505D3ECA636D3D1D0DF8BDC15483BE174799BE76DF6FBEA955ADBD5C99C33D5CFD763E7B8B993EEA35803E6D85E23DD4818DBD243F65BE578698BEF16887BE86E70ABE33752C3DED94513EDD39963E5C798D3E3A62233E83D271BCEB283CBEFBAA92BE285A92BE497E3ABEC33650BC1929253E54E18D3EDC00963E1A0A503E4B20243DD1C60CBE2EE787BEA36598BE70D763BE556989BDD16CE63D5EC9803E5983993ECCBB753E9C9BBF3D7B5DB1BD512E71BE995799BE63C882BEAC32F4BDFCA2753D4BC45E3EC1E2973E339A893ED45E133ED77B06BD2F7C4ABEF22795BEB2448FBE0A682BBE99A0B13B8381343E062D913EB9BB933E6401423EAF86B43C73031DBE89FA8BBEB1F596BE61FA56BE0BF949BD6934043EA39B853EAEEB983EFF256A3EA4FE9B3D4B93D4BDFD3B7CBE7A9999BE195B7BBEF9B1D1BD8CF59E3D60236B3EA2FD983E613A853EA3D1023E4F0550BD1F1258BE721997BE48A98BBE88B11BBE29C2C03C2631433EFBF0933E73EC903E4943333EF28F803B45AD2CBE038B8FBE98F894BE515449BE946200BDCEB6143EFBF0893E07C5973E44B55D3EA19F6F3D5902F7BDE82E83BEBE4B99BE673A70BE356DAEBDFA84C23D99A6763E7689993EFD5D803E",
      moe_layer_down: "0x0400000008AB8B3EC7B81B3E1C7FC0BCA82A43BED9EF93BED8ED90BE1C4A33BEF39C81BB51A62C3E84898F3E9FF9943EAA5A493E0584003D72AF14BE22EF89BEADC597BE16BB5DBE9CC06FBDF4F2F63DB92C833E014C993EA43F703E547DAE3D0775C2BD96A176BE578999BE4B6080BEE0A3E3BDC5558C3D6CD8643E2A7D983E428D873EF0700B3EAA122ABD202451BEBA2996BE4E978DBEADE423BE2A33683CFCAE3B3E0494923E7B71923EADF83A3EA9D6593C0CA724BEBBC38DBE5E1196BE6A7B50BE3E8326BDBF3D0C3E33C3873E306F983EB73E643EBB958A3DEE4EE5BD4D9F80BEDD8599BE2D1876BE6BC0C0BD3D36B03DBACE703E0F53993EBEF0823E6F4DF53DC14673BD0C5A5EBE33D797BE61BC89BE00E613BEEC16043D2B084A3E7715953E6A608F3EDFE72B3EE25C9EBBB30434BEC81391BEBFD093BECF7842BE5F54B9BCE37E1C3EBDDA8B3ED803973E6268573E1D594C3D36A903BE8D7585BED8F298BEA9896ABEBD289DBDF471D33DE1E37B3E9899993E97B37B3EA3D3D23DB1CB9DBD11C06ABEB3F698BEAB6085BE095D03BE8DA54D3D72A4573E850B973E4BC98B3E54361C3EC1F4BBBC08BA42BE2EDC93BEEA0591BE5FC033BEE5D393BBB42D2C3E836F8F3E4D0B953EA3C8493EB1C7023DDB2F14BE03CF89BED1D097BEDA1F5EBE3AFC71BDF6E7F53DC106833E8350993E5B9A703EB794AF3D7660C1BD974A76BE2D8799BE3F8880BE7EB2E4BDF3398B3D1A77643E5974983E77AF873EBBF20B3E46D127BD4AB950BE551A96BE7DB38DBEDD5F24BEF6195F3C883B3B3E2C7E923E6687923E3A6C3B3EFAEF623CF22B24BE9FA78DBED62096BE5BE650BEB8C428BD06BC0B3E0FA1873E1578983E28A0643E9FB18B3D6D40E4BD6B7780BE1B8899BE4B6F76BE15D5C1BDF21EAF3D2374703EA14E993EC616833E8D58F63D430B71BD64F55DBE22CC97BE91DC89BEAA6514BE51D3013D4C9A493EDD03953E7E7A8F3E92602C3E03268CBB888E33BEC8FB90BE7DE493BE89E942BED3DEBDBC6A011C3E8CBC8B3E1711973E30D0573ED5974E3D7C2503BE6C5185BE7BF998BEADE76ABE"
    }
  }
#-}
