# common/: what every program shares.
drafthead_add_test(command_line_test SOURCES command_line_test.cc LIBS drafthead_cli)
drafthead_add_test(heap_test SOURCES heap_test.cc LIBS drafthead_common)
