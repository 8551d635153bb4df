-- wrk diagnostic script: count responses by status code (and print a few non-2xx bodies).
-- Slower than report.lua (wrk hands every response to Lua), so not used for the numbers:
--   wrk -t2 -c64 -d10s -s benches/wrk/status.lua http://127.0.0.1:PORT/
local threads = {}

setup = function(thread)
  table.insert(threads, thread)
end

init = function(args)
  counts = {}
  samples = {}
end

response = function(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
  if (status < 200 or status > 299) and #samples < 3 then
    local h = {}
    for k, v in pairs(headers) do table.insert(h, k .. ": " .. v) end
    table.insert(samples, status .. " | " .. table.concat(h, "; ") .. " | " .. tostring(body))
  end
end

done = function(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for status, n in pairs(t:get("counts")) do total[status] = (total[status] or 0) + n end
    for _, s in ipairs(t:get("samples")) do io.write("SAMPLE " .. s .. "\n") end
  end
  for status, n in pairs(total) do io.write(string.format("STATUS %d %d\n", status, n)) end
end
