"""Idioms read from the programs' TPU v5e captures (tests/profiles/fix_trials/): what XLA:TPU writes differently from
XLA:CPU (fusions nested in fusions, multi-output fusions, float64 rewritten into float32 pairs, random bits recomputed
inside matmul fusions) must not hide an idiom or shrink its stake."""

from __future__ import annotations


import pytest
from xdiag.idioms import IDIOMS
from xdiag.idioms.hlo_graph import elements
from xdiag.idioms.program import Program
from xdiag.profile.reader import read_session_in_process

from tests.conftest import TESTS
from tests.fix_trial_captures import CAPTURES, unpack_capture



@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """(program, label) -> its capture as the recognisers read it, read once."""
    work, read = tmp_path_factory.mktemp("tpu_captures"), {}

    def load(name: str, label: str) -> Program:
        if (name, label) not in read:
            read[(name, label)] = Program(read_session_in_process([unpack_capture(name, label, work)]))
        return read[(name, label)]
    return load


def matches(program: Program, key: str):
    return IDIOMS[key].recognise(program)


def test_an_op_of_a_fusion_nested_in_a_fusion_is_timed_as_the_outer_fusion(program):
    """XLA:TPU nests the threefry hash in the matmul fusions that read a dropout mask: each of its xors is timed as
    the outermost fusion, an op the profile times."""
    dropout = program("dropout_threefry", "before-a")
    (graph,) = dropout.graphs
    key = dropout.module_key(graph.module)
    xors = [s for s in graph.sites() if s.instruction.opcode == "xor" and elements(s.instruction.dims) >= 1 << 20]
    assert len(xors) >= 20 * 9 and all((key, graph.timed_op(s)) in dropout.op_ms for s in xors)


def test_rows_discarded_after_a_convolution_stake_every_convolution_before_the_window(program):
    """A 3x3 and a 1x1 convolution and a log_softmax over a whole feature map, then a 1/16 window: XLA:TPU wraps
    the 1x1 convolution's operand in a layout-only nested fusion, which keeps every row."""
    (match,) = matches(program("discard_crop_head", "before-a"), "discarded_rows")
    assert match.facts["kept_fraction"] == pytest.approx(1 / 16)  # the shifted logits and their log-sum: one window
    assert "maximum_convert_fusion" in match.ops and match.stake_percent > 95
    assert match.facts["matmul"].startswith("convolution → f32[32,160,160,256]")
    assert not matches(program("discard_crop_head", "fixed"), "discarded_rows")


def test_a_softmax_for_argmax_stakes_the_argmax_pass_and_the_logits_write(program):
    """The matmul's fusion takes the softmax's row max, so the logits are written out only for the softmax's two
    passes; an argmax of the logits joins that fusion: both passes and the write are the stake."""
    (match,) = matches(program("softmax_argmax", "before-a"), "softmax_for_argmax")
    assert set(match.ops) == {"fusion", "iota_reduce_fusion"} and match.needed_percent is None
    assert 50 < match.stake_percent < 56 and "needs none" in match.what
    assert not matches(program("softmax_argmax", "fixed"), "softmax_for_argmax")


def test_threefry_bits_recomputed_in_matmul_fusions_stake_the_time_beyond_the_matmuls(program):
    (match,) = matches(program("dropout_threefry", "before-a"), "threefry_random_bits")
    assert match.facts["hash_ops"] == 9 and 40 < match.stake_percent < 46, match.stake_percent
    assert not matches(program("dropout_threefry", "fixed"), "threefry_random_bits")


def test_float64_rewritten_by_xla_tpu_into_float32_pairs_is_found(program):
    """XLA:TPU leaves float64 only at the program's edges (X64SplitHigh/Low, X64Combine): the ops between are the
    float64 work."""
    (match,) = matches(program("x64_features", "before-a"), "float64_on_accelerator")
    # the rest: float32 pieces cut from the input XLA folded into a constant, which reads no float64 pair
    assert match.stake_percent > 95 and "X64Split" in match.what
    assert match.facts["f64_arguments"] == ["f64[512,1024]", "f64[1024,1]"]
    assert not matches(program("x64_features", "fixed"), "float64_on_accelerator")


def test_float64_stakes_the_pair_arithmetic_not_the_float32_work_beside_it_in_a_loop(program):
    """A Monte Carlo loop in float64 draws its shocks in float32: the threefry hash's fusion, 57% of the step, reads
    no float64 pair and stays out; the fusions summing pairs (XLA:TPU's TwoSum: s = a + b, then s - a) are the
    stake, 35.9% of the step, where simulating in float32 took 33.7% off it on the chip (6.33 -> 4.20 ms)."""
    before = program("blind5_heston_mc", "before-a")
    (match,) = matches(before, "float64_on_accelerator")
    assert 33 < match.stake_percent < 39, match.stake_percent
    (graph,) = before.graphs
    hash_fusions = {graph.timed_op(s) for s in graph.sites() if s.instruction.opcode == "xor"
                    and elements(s.instruction.dims) >= 1 << 19}
    assert hash_fusions and not hash_fusions & set(match.ops)
    assert not any(op.startswith("while") for op in match.ops)  # the loop's own op: its trips' bookkeeping
    # the hash's finding, for its part, stakes the hash's fusion, not the loop's float64 work beside it
    (bits,) = matches(before, "threefry_random_bits")
    assert set(bits.ops) == hash_fusions and 55 < bits.stake_percent < 60, (bits.ops, bits.stake_percent)
    assert not matches(program("blind5_heston_mc", "fixed"), "float64_on_accelerator")
    # float32 paths, float64 averages of the payoffs: only their reduction is left
    (kept,) = matches(program("blind5_heston_mc", "f64mean"), "float64_on_accelerator")
    assert kept.stake_percent < 5


def test_complex64_split_by_xla_tpu_into_float32_parts_is_no_float64(program):
    """XLA:TPU's 64-bit rewrite splits a complex64 argument into its float32 real and imaginary parts with the same
    X64Split and X64Combine calls it uses for float64: the ops between compute in float32."""
    assert not matches(program("blind3_tight_binding", "before-a"), "float64_on_accelerator")


def test_a_complex_matmul_split_by_xla_tpu_is_found_by_its_gauss_form(program):
    """XLA:TPU runs a complex64 product as 3 real matmuls, one of them reading the sum of a complex operand's real and
    imaginary parts; a real matrix times those parts forms no such sum."""
    (match,) = matches(program("blind3_tight_binding", "before-a"), "complex_matmul")
    assert match.facts["complex_products"] == 24 and match.facts["real_matmuls"] == 72
    assert "c64[4096,4096] × c64[4096,1024], complex64" in match.what and match.stake_percent > 90
    # 2 real matmuls per product at the chip's peak: 24 × 2 × 2·4096²·1024 FLOPs a step
    assert match.facts["needed_tflop_per_step"] == pytest.approx(24 * 2 * 2 * 4096 ** 2 * 1024 / 1e12, rel=1e-3)
    assert not matches(program("blind3_tight_binding", "fixed"), "complex_matmul")


def test_jnp_isin_comparing_all_pairs_is_a_membership_test_on_a_tpu(program):
    """XLA:TPU fuses jnp.isin's broadcast compare with its reduction by or: 4,194,304 ids × 8,192 listed values. None
    of the five changes timed on the chip (a gather from a bool or int32 table, jnp.isin's sort and binary_search
    methods, a one-hot matmul over 128-wide table rows) compares all pairs."""
    (match,) = matches(program("blind3_token_blocklist", "before-a"), "membership_all_pairs")
    assert (match.facts["elements"], match.facts["listed_values"]) == (2048 * 2048, 8192)
    assert match.ops == ["compare_reduce_fusion"] and match.stake_percent > 99
    for label in ("fixed", "table_i32", "sort", "binary_search", "onehot_mxu"):
        assert not matches(program("blind3_token_blocklist", label), "membership_all_pairs"), label



def test_a_one_hot_matmul_faster_per_row_than_a_gather_is_not_changed_to_a_lookup_on_a_tpu(program):
    """The blocklist as 393 rows of 128, each token's row picked by a one-hot matmul: on the chip that took 3.31 ms
    and the gathers that would replace it 29.26 and 33.25 ms. The one-hot's width is the matmul's contracted
    dimension (393), not its largest; its change is withheld there with that measurement, and a one-hot over a table
    of 32,768 rows, which a lookup made 56% faster, keeps its change."""
    structured = IDIOMS["structured_matmul"]
    (small,) = matches(program("blind3_token_blocklist", "onehot_mxu"), "structured_matmul")
    assert (small.params["values"], small.params["rows"]) == (393, 2048 * 2048)
    withheld = structured.withheld(small, {"platform": "TPU"})
    assert "29.26 ms" in withheld and "a table of 393" in withheld and "{" not in withheld
    assert small.work_ratio is None  # no unneeded work to count where the lookup was measured slower
    (large,) = matches(program("onehot_embed", "before-a"), "structured_matmul")
    assert large.params["values"] == 32768 and not structured.withheld(large, {"platform": "TPU"})
    assert "jax.nn.one_hot(ids, 32768) @ table" in structured.change_text(large, {"platform": "TPU"})

def test_a_carried_cache_copied_around_a_multi_output_update_is_found_with_its_old_value_read(program):
    """XLA:TPU fuses the slot's update with a read beside it (a fusion of two outputs) and copies the key cache
    before it and after it; the attention reads the cache as it was."""
    (match,) = matches(program("scan_buffer_copy", "before-a"), "loop_copies_carried_buffer")
    assert match.facts["copies"] == 2 and match.facts["buffers"] == ["bf16[256,32,1024]"] * 2
    assert match.facts["old_value_reads"] == ["fusion.53"] and 18 < match.facts["copies_percent"] < 20
    assert not matches(program("scan_buffer_copy", "fixed"), "loop_copies_carried_buffer")


def test_recomputation_of_a_loop_invariant_value_is_the_loops_not_the_remats(program):
    """jax.checkpoint's cell rebuilds an invariant merged weight on every trip of the backward scan: hoisting it
    removes that time, so the remat finding stakes only the rest of what it recomputes."""
    hoist = program("hoist_invariant", "before-a")
    (invariant,) = matches(hoist, "loop_invariant_compute")
    (remat,) = matches(hoist, "needless_remat")
    assert invariant.ops == ["fusion.46"] and "fusion.46" not in remat.what
    assert remat.stake_percent < invariant.stake_percent


def test_a_memory_bound_matmul_reading_a_float32_argument_predicts_half_that_arguments_share_of_its_time(program):
    """Six GIN layers each read a 1 GiB float32 0/1 adjacency in adj @ h (128 columns): the matmuls are bound by its
    bytes (91% of theirs), and at precision DEFAULT the matrix unit rounds it to bfloat16 anyway; stored as bfloat16
    it is half the bytes, and nothing else of the matmuls' time is staked."""
    idiom = IDIOMS["float32_operand_rounded_by_matmul"]
    (match,) = matches(program("blind3_gin_contacts", "before-a"), "float32_operand_rounded_by_matmul")
    assert match.params["arguments"] == "adj" and match.facts["argument_shape"] == "f32[16,4096,4096]"
    assert len(match.ops) == 6 and match.stake_percent > 90
    low, high = idiom.predicted_percent(match)
    assert 40 < high < 46 and low == pytest.approx(0.8 * high, abs=0.1)
    assert "adj.astype(jnp.bfloat16)" in idiom.change_text(match, {"platform": "TPU"})
    assert not matches(program("blind3_gin_contacts", "fixed"), "float32_operand_rounded_by_matmul")


def test_promoted_weights_predict_half_their_share_of_the_matmuls_bytes(program):
    """With the adjacency bfloat16, the first layer's matmul meets a float32 argument of node features that is 6% of
    its bytes: bfloat16 there saves at most 3% of that matmul, not half of it. Weights that are all of a decode
    step's bytes keep half of its time."""
    idiom = IDIOMS["promoted_matmul"]
    (match,) = matches(program("blind3_gin_contacts", "fixed"), "promoted_matmul")
    assert match.stake_percent > 20 and idiom.predicted_percent(match)[1] < 1.0
    (decode,) = matches(program("dtype_promotion", "before-a"), "promoted_matmul")
    assert idiom.predicted_percent(decode)[1] == pytest.approx(decode.stake_percent / 2, abs=0.2)
    assert not matches(program("dtype_promotion", "before-a"), "float32_operand_rounded_by_matmul")


def test_jax_jit_made_inside_the_step_is_seen_where_the_capture_holds_one_step_and_one_compile(program):
    """The step calls jax.jit(functools.partial(...)) and then what it made: with one step traced, the capture holds
    one compile, outside the device's one execution (its step); the Python tracer's frames show the wrap and the
    compile inside the step function's call."""
    (match,) = matches(program("blind3_pinn_heat", "before-a"), "recompile_per_shape")
    assert match.function == "step" and match.line.endswith("blind3_pinn_heat.py:68")  # the call, in the HLO's stack
    assert match.stake_percent > 99 and 1800 < match.facts["loop_step_ms"] < 1900
    change = IDIOMS["recompile_per_shape"].change_text(match)
    assert change.startswith("build the jitted function once") and "jit sgd_step once" in change
    assert "jax.jit(functools.partial(sgd_step, **settings)) once, before the loop" in change
    assert not matches(program("blind3_pinn_heat", "fixed"), "recompile_per_shape")
    assert not matches(program("blind3_pinn_heat", "before-a"), "static_argument_per_value")


def test_a_loop_of_boolean_mask_indexes_reads_each_mask_back_and_is_changed_to_one_segment_sum(program):
    """x[labels == c].mean(0) per class: each trip reads its mask back (NumPy's nonzero on the host), so jax.jit
    refuses the loop; the change is one segment sum over the labels divided by the counts, its groups the trips."""
    (match,) = matches(program("blind3_proto_episode", "before-a"), "boolean_mask_in_loop")
    assert match.facts["mask_reads_per_call"] == 128 and match.facts["dispatches_per_trip"] == 8
    assert 98 < match.stake_percent < 99.5 and 480 < match.facts["loop_step_ms"] < 500
    assert "f32[8192,256]" in match.what and "comparing s32[8192]" in match.what
    change = IDIOMS["boolean_mask_in_loop"].change_text(match)
    assert "jax.ops.segment_sum(x, labels, num_segments=128)" in change and "jnp.bincount(labels, length=128)" in change
    assert "NonConcreteBooleanIndexError" in change and "jnp.mean(x, axis=0, where=mask[:, None])" in change
    assert not matches(program("blind3_proto_episode", "fixed"), "boolean_mask_in_loop")


def test_a_loop_of_eager_ops_with_an_int_read_each_trip_is_computed_for_every_value_at_once(program):
    """Per class c: pred == c, labels == c, &, | and two jnp.sums run eagerly, each sum read with int(): the capture's
    steps split at the reads (one a trip), so the loop is timed from the Python tracer's frames, its trips by its
    least-run op and the change compares against jnp.arange on a new axis."""
    (match,) = matches(program("blind5_seg_eval", "before-a"), "eager_loop_reads_each_trip")
    assert match.facts["trips_per_call"] == 60 and match.facts["reads_per_trip"] == 2
    assert match.facts["one_op_programs_per_trip"] == 6 and 95 < match.stake_percent <= 100
    assert "s32[8,256,256]" in match.what and "int()" in match.what and "blind5_seg_eval.py:" in match.line
    change = IDIOMS["eager_loop_reads_each_trip"].change_text(match)
    assert "x[..., None] == jnp.arange(60)" in change and "axis=(0, 1, 2)" in change and "np.asarray" in change
    assert not matches(program("blind5_seg_eval", "fixed"), "eager_loop_reads_each_trip")


def test_a_graph_kept_as_numpy_and_shipped_to_every_call_is_put_on_the_device_once(program):
    """A node-feature matrix and an edge list, NumPy arrays passed to the jitted predict on every call: read by a
    matmul's left side and by gathers, they are neither weights nor a mask; the device waits for their copies."""
    (match,) = matches(program("blind5_gnn_inference", "before-a"), "data_uploaded_each_step")
    assert match.facts["data_arguments"] == ["f32[169343,128]", "s32[2,1166243]"]
    assert match.facts["data_share_of_shipped_percent"] == 100 and 50 < match.stake_percent < 57
    assert "feats" in match.what and "edge_index" in match.what
    change = IDIOMS["data_uploaded_each_step"].change_text(match)
    assert "feats = jnp.asarray(feats, jnp.float32); edge_index = jnp.asarray(edge_index, jnp.int32)" in change
    assert not matches(program("blind5_gnn_inference", "before-a"), "weights_uploaded_each_step")
    assert not matches(program("blind5_gnn_inference", "fixed"), "data_uploaded_each_step")
    (cast,) = matches(program("blind5_gnn_inference", "precast"), "data_uploaded_each_step")  # cast, still shipped
    assert cast.stake_percent < match.stake_percent / 3


def test_a_large_result_read_back_for_a_numpy_argmax_is_sized_by_the_programs_output_and_timed_by_its_frames(program):
    """On a TPU the read (np.asarray: jax.Array.__array__) copies the whole output across the host link and NumPy's
    argmax (an array method in C, `$<unknown> argmax`) follows it on the same thread: both are the stake; the device's
    own pass over the array is what the change needs. Reduced on the device, only the class ids come back."""
    (match,) = matches(program("blind3_eval_21k", "before-a"), "reduced_on_host")
    assert match.facts["read_shape"] == "f32[2048,21843]" and match.params["reduction"] == "argmax"
    assert match.module == "jit_predict" and match.function == "step"
    assert match.facts["host_reduction_percent"] > 90 and match.stake_percent > 99 and match.needed_percent < 1
    change = IDIOMS["reduced_on_host"].change_text(match)
    assert change.startswith("take the argmax on the device: return jnp.argmax(y, axis=-1) from predict"), change
    assert not matches(program("blind3_eval_21k", "fixed"), "reduced_on_host")


def test_a_scatter_whose_indices_xla_tpu_sorts_on_every_run_is_found_with_the_sort(program):
    """XLA:TPU sorts the indices of a scatter-add not declared sorted (a sort made for the same op) and then marks the
    scatter sorted: where the indices are a constant of the program, the scatters and that sort are the stake."""
    (match,) = matches(program("segment_pool", "before-a"), "scatter_unsorted_indices")
    assert "sort.1" in match.ops and 85 < match.stake_percent < 95, (match.ops, match.stake_percent)
    assert "XLA sorts them on every run" in match.what
    assert not matches(program("segment_pool", "fixed"), "scatter_unsorted_indices")
    # a gather's gradient (autodiff's scatter, of ids made per batch or fixed): no scatter of the program's own
    assert not matches(program("list_to_array", "fixed"), "scatter_unsorted_indices")
    assert not matches(program("onehot_embed", "fixed"), "scatter_unsorted_indices")


def test_an_integer_matmul_xla_tpu_writes_as_a_convolution_is_found(program):
    (match,) = matches(program("cooccurrence_int_matmul", "before-a"), "integer_matmul")
    assert match.stake_percent > 99 and match.facts["flops_per_run"] == 2 * 4096 ** 3, match.what
    assert not matches(program("cooccurrence_int_matmul", "fixed"), "integer_matmul")


def test_batched_matmuls_xla_tpu_writes_as_convolutions_keep_their_batch(program):
    """XLA:TPU writes a batched matmul as a base-dilated convolution: its batch is what the shapes leave, so key and
    value heads repeated 8 times in a batch of 256 are repeats, and weights broadcast 128 times to a batch of 128 a
    tile (withheld there: XLA reads it in place)."""
    (repeated,) = matches(program("gqa_repeat_kv", "before-a"), "repeated_kv_heads")
    assert repeated.params["repeat"] == 8 and 70 < repeated.stake_percent < 75, repeated.what
    assert not matches(program("gqa_repeat_kv", "fixed"), "repeated_kv_heads")
    (tiled,) = matches(program("tiled_adapter_weights", "before-a"), "weights_tiled_per_example")
    assert tiled.params["batch"] == 128 and tiled.params["tile_written"] is False, tiled.what
    assert not matches(program("tiled_adapter_weights", "fixed"), "weights_tiled_per_example")
    assert not matches(program("gqa_repeat_kv", "before-a"), "weights_tiled_per_example")
    # a weight gradient that contracts a spatial dimension too (a ViT's, against a broadcast of its pooled gradient)
    # has no batch: no split of its shapes holds one
    assert not matches(program("vit_nnx_train", "noremat"), "repeated_kv_heads")


def test_repeated_kv_heads_under_one_query_contractions_written_as_multiply_reduce(program):
    """Decoding one query per sequence, XLA:TPU writes the attention's contractions as a multiply and a sum: the
    key/value cache repeated 8 times to the query heads (the keys' repeat made inside the scores' sum, the values'
    written out) is still the repeat, and the change groups the queries by the 2 key/value heads."""
    (repeated,) = matches(program("blind7_gqa_decode", "before-a"), "repeated_kv_heads")
    assert repeated.params == {"repeat": 8, "form": "multiply_reduce", "axis": 1, "kv_heads": 2, "head_dim": 128}
    assert repeated.line.endswith(".py:53") and "bf16[16,2,4096,128] →" in repeated.what, repeated.what
    assert 80 < repeated.stake_percent < 95 and repeated.needed_percent < 10, repeated.what
    assert not matches(program("blind7_gqa_decode", "fixed"), "repeated_kv_heads")
    assert not matches(program("blind7_gqa_decode", "expanded_cache"), "repeated_kv_heads")


def test_a_linear_recurrence_in_a_tiny_scan_is_told_to_scan_associatively(program):
    """h = a * h + b by jax.lax.scan over 4,096 trips, forward and its gradient backward: each loop passes on the
    state it found multiplied by one value and added to another (the backward's through a select and a sum), so the
    change is jax.lax.associative_scan at the scan's line, the loops of that line one match."""
    (match,) = matches(program("blind7_lru_scan", "before-a"), "scan_tiny_body")
    assert match.params["linear"] and not match.params["independent"] and match.facts["loops"] >= 2, match.what
    assert match.line.endswith(".py:42") and 75 < match.stake_percent < 85, match.what
    change = IDIOMS["scan_tiny_body"].change_text(match, {"platform": "TPU"})
    assert change.startswith("evaluate the recurrence at ") and "jax.lax.associative_scan(combine, (a, b)" in change
    assert not IDIOMS["scan_tiny_body"].withheld(match, {"platform": "TPU"})
    assert not matches(program("blind7_lru_scan", "fixed"), "scan_tiny_body")


def test_arguments_xla_tpu_stacks_by_dynamic_update_slices_are_found(program):
    """XLA:TPU writes jnp.stack of the step's 32 layer arguments as a chain of dynamic-update-slices (31 of them
    reading their argument as asynchronous slices joined by a ConcatBitcast), not a concatenate."""
    (match,) = matches(program("stacked_layers_scan", "before-a"), "params_stacked_each_step")
    assert match.facts["stacked_arrays"] == 32 and 10 < match.stake_percent < 14, match.what
    assert not matches(program("stacked_layers_scan", "fixed"), "params_stacked_each_step")


def test_an_argument_is_named_by_its_pytree_path_not_by_its_hlo_parameter(program):
    """A decode step's float32 weights are named as the user's code names them (params['layers'][7]['qkv'], the path
    JAX keeps as the parameter's op name), not by the HLO parameter's mangled name (params__layers___7___qkv__); the
    weights of one tree are cast as one tree, not array by array."""
    (match,) = matches(program("blind4_decode_policy", "before-a"), "float32_operand_rounded_by_matmul")
    assert "params['layers'][7]['qkv']" in match.params["arguments"] and "__" not in match.params["arguments"]
    change = IDIOMS[match.idiom].change_text(match, {"platform": "TPU"})
    assert "params = jax.tree.map(lambda w: w.astype(jnp.bfloat16) if w.dtype == jnp.float32 else w, params)" in change


def test_a_loop_of_calls_marked_one_call_a_step_with_an_eager_read_each_trip_is_changed_to_a_scan(program):
    """A rollout's Python loop: each trip calls the jitted step and reads `int(done.sum())` back (an eager one-op
    program of its output and a sync), the capture marks each call a step, and the trips' outputs are stacked after
    the loop: one jax.lax.scan, at the line that calls the step; the scan's capture is no loop of calls."""
    (match,) = matches(program("blind4_ppo_rollout", "before-a"), "python_loop_of_calls")
    assert match.module == "jit_transition" and match.stake_percent > 95
    assert match.line == "programs/blind4_ppo_rollout.py:115"
    change = match.params["change"]
    assert "jax.lax.scan" in change and "jnp.stack of 64 " in change and "read once, after the scan" in change
    assert not matches(program("blind4_ppo_rollout", "fixed"), "python_loop_of_calls")


def test_a_step_that_casts_its_float32_weights_stakes_the_whole_tree_and_the_convert_of_its_own(program):
    """A decode step casts its float32 parameters to bfloat16 itself (jax.tree.map at its top): XLA:TPU fuses most
    casts into the matmuls, two of which often share one op (an MLP's up and down, each half its bytes), and converts
    the embedding in an op of its own; the stake counts every such matmul and that convert, and the change casts the
    whole tree once."""
    idiom = IDIOMS["float32_operand_rounded_by_matmul"]
    (match,) = matches(program("blind4_decode_policy", "before-a"), "float32_operand_rounded_by_matmul")
    assert match.facts["matmuls"] >= 11 and match.facts["converts"] == 1 and match.facts["arguments"] >= 20
    assert "converts params['embed'] to bfloat16 itself" in match.what
    low, high = idiom.predicted_percent(match)
    assert 33.9 / 1.5 < (low + high) / 2 < 33.9 * 1.5  # the chip: 33.9% shorter steps, the tree cast once at load
    change = idiom.change_text(match, {"platform": "TPU"})
    assert "params = jax.tree.map(lambda w: w.astype(jnp.bfloat16)" in change and "20 arrays" in change
    assert not matches(program("blind4_decode_policy", "fixed"), "float32_operand_rounded_by_matmul")


def test_a_large_mask_shipped_every_call_and_only_added_to_the_scores_is_built_from_its_ids_instead(program):
    """A batcher's 128 MiB float32 attention bias is passed from NumPy on every call and only added to each layer's
    scores (broadcast over the heads); integer ids of its leading shape are shipped with it: the change builds it in
    the jitted function from them, staked by the device's wait for the bias's bytes. Built there, nothing is found."""
    (match,) = matches(program("blind4_packed_encoder", "before-a"), "mask_uploaded_each_step")
    assert match.facts["mask_shape"] == "f32[32,1024,1024]" and match.facts["made_of"][0] == "s32[32,1024]"
    assert 30 < match.stake_percent < 33 and "4 elementwise ops (add) making f32[32,8,1024,1024]" in match.what
    assert "build it inside the jitted function" in match.params["change"]
    assert not matches(program("blind4_packed_encoder", "fixed"), "mask_uploaded_each_step")
def test_a_catalogues_embeddings_recomputed_on_every_request_are_found_with_the_tower_call(program):
    """Each call scores 256 requests against a fixed catalogue of 196,608 items, running the item tower over the
    whole catalogue inside the jitted step (30.1% of the step on the chip; computed once outside, the step took
    30.0% less). The requests (the argument with the results' 256 rows) and the user tower are the rest."""
    (match,) = matches(program("blind4_candidate_retrieval", "before-a"), "call_invariant_compute")
    assert match.facts["arguments"] == ["params['item']", "item_x"]
    assert match.facts["other_arguments"] == ["params['user']", "user_x"]
    assert match.facts["results"][0] == "f32[196608,128]" and match.facts["matmuls"] == 3
    assert 29 < match.stake_percent < 31 and "multiply_reduce_fusion" in match.ops
    assert match.function == "tower" and match.line.endswith("blind4_candidate_retrieval.py:49")
    change = IDIOMS["call_invariant_compute"].change_text(match)
    assert "jax.jit(tower)(params['item'], item_x)" in change and "the jitted retrieve" in change
    assert not matches(program("blind4_candidate_retrieval", "fixed"), "call_invariant_compute")
    # a training step's blurred batch reads the images alone, but the images are the step's batch: it updates its
    # parameters, so what it does not update is no sign of what stays the same between calls
    assert not matches(program("where_branches", "before-a"), "call_invariant_compute")


def test_a_stack_of_2x2_inverses_is_their_closed_form_not_another_factorisation(program):
    """XLA:TPU runs jnp.linalg.inv over 262,144 stacked 2×2 matrices as its batched LU custom call, pivot gathers and
    blocked triangular solves: the closed form, not a solve in place of the inverse, is the change."""
    before = program("blind5_splat_project", "before-a")
    (match,) = matches(before, "tiny_matrix_decomposition")
    assert match.facts["matrices"] == 262144 and match.params["order"] == 2 and match.stake_percent > 90
    assert match.line.endswith("blind5_splat_project.py:49") and match.params["routines"] == "jnp.linalg.inv"
    assert not matches(before, "linear_algebra")
    assert not matches(program("blind5_splat_project", "fixed"), "tiny_matrix_decomposition")


def test_pairwise_squared_distances_hold_where_xla_tpu_writes_the_difference_as_an_add(program):
    """XLA:TPU folds the negation of a constant side into it and writes (a − b) as a + (−b), the add still named for
    the framework's sub: the squared distances are the expansion's to remove all the same."""
    (match,) = matches(program("blind5_gp_predict", "before-a"), "pairwise_broadcast_reduce")
    assert match.facts["kind"] == "squared distance" and match.stake_percent > 85
    assert match.params["pairs"] == "f32[4096,8192,64]" and match.line.endswith("blind5_gp_predict.py:29")
    assert not matches(program("blind5_gp_predict", "fixed"), "pairwise_broadcast_reduce")


def test_a_matrix_the_loop_rebuilds_from_its_clock_is_solved_by_cholesky(program):
    """An implicit step's matrix is made each trip from the loop's scalar clock: XLA:TPU's LU custom call reads it
    inside the loop's body, so nothing can be factored once; the Cholesky solve is the change."""
    (match,) = matches(program("blind5_heat_columns", "before-a"), "linear_algebra")
    assert match.facts["rebuilt_each_trip"] and match.stake_percent > 90
    change = IDIOMS["linear_algebra"].change_text(match)
    assert change.startswith("solve by Cholesky at programs/blind5_heat_columns.py:43"), change
    assert not matches(program("blind5_heat_columns", "cholesky"), "linear_algebra")


def test_an_eigendecomposition_read_only_for_a_solve_and_its_log_determinant_is_a_cholesky_factor(program):
    """XLA:TPU runs jnp.linalg.eigh of 4 vmapped kernel matrices as its QDWH and Jacobi solver; the program reads the
    vectors only in products with a vector, the values divided into them and their logs summed: a Cholesky factor."""
    (match,) = matches(program("blind6_gp_select", "before-a"), "eigendecomposition_for_solve")
    assert match.facts["order"] == 1024 and match.facts["matrices"] == 4 and match.stake_percent > 95
    assert match.params["solves"] and match.params["logdet"] and "4 matrices of order 1,024" in match.what
    assert match.line.endswith("blind6_gp_select.py:41")
    change = IDIOMS["eigendecomposition_for_solve"].change_text(match)
    assert "jax.scipy.linalg.cho_solve((chol, True), y)" in change and "jnp.log(jnp.diagonal(chol))" in change
    assert not matches(program("blind6_gp_select", "before-a"), "decomposition_for_one_value")
    assert not matches(program("blind6_gp_select", "fixed"), "eigendecomposition_for_solve")


def test_a_convolution_written_as_patches_and_a_matmul_is_one_convolution(program):
    """jax.lax.conv_general_dilated_patches is a convolution with a one-hot kernel built from iotas, which XLA:TPU runs
    dense against that kernel; a matmul reads its 9x-channel patches, and the gradient is another such convolution."""
    (match,) = matches(program("blind6_weather_conv", "before-a"), "convolution_as_patches_matmul")
    assert match.facts["patch_convolutions"] == 4 and match.facts["gradient_convolutions"] == 3
    assert match.facts["window"] == [3, 3] and match.facts["patches"] == [8, 128, 256, 576]
    assert "bf16[8,128,256,64] → bf16[8,128,256,576]" in match.what and match.stake_percent > 95
    assert match.line.endswith("blind6_weather_conv.py:28") and "blind6_weather_conv.py:29" in match.what
    change = IDIOMS["convolution_as_patches_matmul"].change_text(match)
    assert 'jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))' in change
    assert "(3, 3, 64, 64)" in change
    for after in ("fixed", "shifted_matmuls"):
        assert not matches(program("blind6_weather_conv", after), "convolution_as_patches_matmul")


def test_a_decoding_loop_that_reruns_the_model_over_its_buffer_is_a_cache_not_rows_to_batch(program):
    """A fori_loop whose every trip runs the whole transformer over the 256-position token buffer it carries, keeps
    one position by a dynamic slice at the loop's index and writes the next token into the buffer: a key/value
    cache is the change; the trips read what the trips before wrote, so no batching of them over rows holds."""
    before = program("blind6_lm_decode", "before-a")
    (match,) = matches(before, "decode_recomputes_prefix")
    assert match.params["positions"] == 256 and match.facts["trips"] == 128 and match.facts["buffer"] == "s32[8,256]"
    assert match.stake_percent > 95 and match.facts["matmul_ops"] >= 16
    assert match.line.endswith("blind6_lm_decode.py:83") and match.facts["picked_at"].endswith("blind6_lm_decode.py:84")
    assert not matches(before, "loop_invariant_weights")
    for after in ("fixed", "cache_stream"):  # one position per trip against the cache
        assert not matches(program("blind6_lm_decode", after), "decode_recomputes_prefix")
    # A decode loop that keeps a cache also reads its whole carried buffer (the cache) in every trip's attention and
    # writes one position of it; its weights are applied to one new position per sequence, never to every position.
    cached = Program(read_session_in_process([TESTS / "profiles" / "tpu_v5e" / "kv_decode_b64.xplane.pb"]))
    assert not matches(cached, "decode_recomputes_prefix")


def test_every_overlapping_window_gathered_and_summed_is_rolling_sums_from_cumulative_sums(program):
    """r[:, arange(n)[:, None] + arange(64)]: XLA:TPU builds the indices from two iotas (with jnp's wrap of negative
    indices and the clamp into bounds), passes them through AssumeGatherIndicesInBound and writes the 614 MiB copy
    of every window, which the mean's and the variance's reductions read over the window axis."""
    (match,) = matches(program("blind6_rolling_zscore", "before-a"), "rolling_windows_gathered")
    assert match.params["window"] == 64 and match.params["axis"] == 1 and match.params["length"] == 2520
    assert match.facts["copy"] == "f32[1024,2457,64]" and match.facts["summed_by"] == 2 and match.stake_percent > 95
    assert match.line.endswith("blind6_rolling_zscore.py:28") and match.params["sum1"] == "c1[:, 64:] - c1[:, :-64]"
    for after in ("fixed", "reduce_window"):
        assert not matches(program("blind6_rolling_zscore", after), "rolling_windows_gathered")


def test_particles_kept_as_an_axis_of_3_components_are_split_into_one_array_each(program):
    """XLA:TPU lays a (1,048,576, 3) state with its axis of 3 in the tile's 8 rows, and the takes, stacks and cross
    products around it work on single-component slices padded the same way; transposed to (3, 1,048,576) the axis is
    the rows again and the step the same, so the split into 1-D arrays per component is the change, not a layout."""
    before = program("blind6_particles", "before-a")
    (match,) = matches(before, "components_as_short_axis")
    assert match.params["shape"] == "f32[1048576,3]" and match.params["k"] == 3 and match.stake_percent > 90
    assert match.facts["tile_dimension"] == "rows" and match.facts["component_takes"] >= 3
    assert match.line.endswith("blind6_particles.py:40")
    assert "x, y, z = tuple(pos.T)" in IDIOMS["components_as_short_axis"].change_text(match)
    assert not matches(before, "unaligned_minor_dims")
    (transposed,) = matches(program("blind6_particles", "fixed"), "components_as_short_axis")
    assert transposed.params["shape"] == "f32[3,1048576]" and transposed.facts["tile_dimension"] == "rows"
    assert not matches(program("blind6_particles", "components"), "components_as_short_axis")


def test_a_table_differentiated_through_its_lookup_is_updated_by_its_rows(program):
    """The gradient of table[ids] with respect to a (1,000,000, 128) table: the reverse pass scatter-adds the looked-up
    rows into a broadcast zero of the table's shape, and the update reads the table and that gradient whole; with the
    rows differentiated and added into the table (donated or not) neither is left."""
    before = program("blind6_rec_embed", "before-a")
    (match,) = matches(before, "dense_lookup_gradient")
    assert match.params["shape"] == "f32[1000000,128]" and match.params["table"] == "carry[0]['table']"
    assert match.facts["looked_up_rows"] == 8192 * 26 and 20 < match.stake_percent < 35
    assert match.line.endswith("blind6_rec_embed.py:44") and match.params["update_at"].endswith("rec_embed.py:63")
    for label in ("fixed", "rows_no_donate"):
        assert not matches(program("blind6_rec_embed", label), "dense_lookup_gradient")
    # a token classifier's table[ids] of a (32,768, 1,024) trained table, the step not donating it: the same gradient
    (other,) = matches(program("onehot_embed", "fixed"), "dense_lookup_gradient")
    assert other.params["shape"] == "f32[32768,1024]" and other.line.endswith("onehot_embed.py:20")


def test_the_kernel_gradient_of_a_3x3_convolution_is_no_long_window(program):
    """XLA writes dL/dw of a 3x3 convolution as the activations convolved with the output's gradient: a window of
    128x256 taps that slides over 3x3 positions into the kernel. That is no long filter the program applies, and
    the kernel's forward and input-gradient convolutions slide 3x3 windows."""
    fixed = program("blind6_weather_conv", "fixed")
    gradients = [s.instruction for g in fixed.graphs for s in g.sites() if s.instruction.opcode == "convolution"
                 and s.instruction.conv_output_spatial == (3, 3)]
    assert len(gradients) == 4 and all(ins.dims[:2] == (3, 3) for ins in gradients)
    assert not matches(fixed, "long_window_convolution")


def test_a_gaussian_process_kernel_factored_by_cholesky_is_no_attention(program):
    """exp(-d²/2l²) of a 1024x1024 matrix a product made, read by a blocked Cholesky whose 128x128 blocks are
    [4, 8, 128, 128] arrays: square matrices, but no softmax along keys and no product with values. Attention's
    scores, its softmax and the product after it are what the anatomy's attention needs in the HLO."""
    from xdiag.analysis.anatomy import components
    from xdiag.analysis.attention_hlo import attention_key_lengths
    from xdiag.analysis.op_stats import op_stats

    def component_keys(capture: Program) -> dict[str, float]:
        stats = op_stats(capture.session)
        total = sum(s.total_ps for s in stats)
        return {c.key: c.share_percent for c in components([s.row(total) for s in stats])}

    gp = program("blind6_gp_select", "fixed")
    assert not any(attention_key_lengths(g.module) for g in gp.graphs)
    assert "materialised_attention" not in component_keys(gp)
    lm = program("remat_linen_lm", "before-a")
    assert 512 in {s for g in lm.graphs for s in attention_key_lengths(g.module)}
    assert component_keys(lm)["materialised_attention"] > 10


def test_a_gradient_taken_by_forward_mode_is_one_reverse_pass(program):
    """-jax.jacfwd(energy)(pos) of a scalar pair energy over a (3, 256) position array: 768 tangents of an identity
    basis through the forward-mode (768, 256, 256) pair arrays, one number each; with jax.value_and_grad, or with
    jax.jacrev (one cotangent), no basis of 768 is left."""
    (match,) = matches(program("blind7_md_forces", "before-a"), "gradient_by_forward_mode")
    assert match.facts["tangents"] == 768 and match.facts["basis"] == "pred[768,3,256]" and match.stake_percent > 95
    assert match.line.endswith("blind7_md_forces.py:37") and match.function == "pair_energy"
    assert "jax.value_and_grad(pair_energy)(x)" in match.params["change"]
    for after in ("fixed", "jacrev"):
        assert not matches(program("blind7_md_forces", after), "gradient_by_forward_mode")
