# tests for weights (fragment of tests/CMakeLists.txt): safetensors I/O, shard loading, the
# synthetic generator, drafthead-quantize end to end.
drafthead_add_test(safetensors_test SOURCES safetensors_test.cc LIBS drafthead_weights
  LABELS weights TIMEOUT 120)
drafthead_add_test(weights_test SOURCES weights_test.cc LIBS drafthead_weights
  LABELS weights TIMEOUT 120)
drafthead_add_test(quantize_test SOURCES quantize_test.cc LIBS drafthead_weights
  LABELS weights TIMEOUT 120)
# quantize_test runs the binary.
add_dependencies(quantize_test drafthead-quantize)
