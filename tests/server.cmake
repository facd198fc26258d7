# Server-side tests: the request edge, batching, the in-process engine, and end to end.
drafthead_add_test(request_test SOURCES request_test.cc LIBS drafthead_api)
drafthead_add_test(batcher_test SOURCES batcher_test.cc LIBS drafthead_api)
drafthead_add_test(engine_test SOURCES engine_test.cc LIBS drafthead_api drafthead_test_reference)
drafthead_add_test(rendezvous_test SOURCES rendezvous_test.cc LIBS drafthead_api)
drafthead_add_test(e2e_test SOURCES e2e_test.cc LIBS drafthead_api drafthead_test_reference TIMEOUT 900)
add_dependencies(e2e_test drafthead-server drafthead-quantize)
drafthead_add_test(ops_test SOURCES ops_test.cc LIBS drafthead_api drafthead_test_reference TIMEOUT 900)
add_dependencies(ops_test drafthead-server)
