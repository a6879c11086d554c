//! Redis-backed distributed workqueue: data model, Lua scripts, rate limiters, expectations
