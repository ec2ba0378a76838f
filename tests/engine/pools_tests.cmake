# EnginePool / ModelPool tests (serving owner).
# Fake-engine / fake-loader tests: pool semantics only.
bonsai_add_test(engine_pool_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/engine_pool_test.cpp LIBS bonsai_engine TIMEOUT 120)
bonsai_add_test(model_pool_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_pool_test.cpp LIBS bonsai_engine TIMEOUT 120)
# Real replicas on ../shared/models/stories260K (skips without the fixture).
bonsai_add_test(engine_pool_real_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/engine_pool_real_test.cpp LIBS bonsai_engine TIMEOUT 300)
# Scheduler (continuous batching) over stories260K (skips without the fixture).
bonsai_add_test(engine_scheduler_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/scheduler_test.cpp LIBS bonsai_engine bonsai_synth TIMEOUT 300)
