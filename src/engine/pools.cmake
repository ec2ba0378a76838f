# EnginePool / ModelPool sources (serving owner), added to bonsai_engine,
# which src/engine/CMakeLists.txt creates.
target_sources(bonsai_engine PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/engine_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scheduler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_spec_fields.cpp  # the one ModelSpec option parser (flags, TOML, admin JSON)
)
