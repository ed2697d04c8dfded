-- bench/ingest: wrk sends one record per request, a 500-byte JSON payload, with the
-- bench's token (WRK_TOKEN) to WRK_PATH. Statuses other than the expected one are counted
-- by wrk as "Non-2xx or 3xx responses" (any 4xx/5xx), which the run script checks.
local pad = string.rep("x", 500 - #'{"pad":""}')
wrk.method = "POST"
wrk.path = os.getenv("WRK_PATH")
wrk.body = '{"pad":"' .. pad .. '"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("WRK_TOKEN")
