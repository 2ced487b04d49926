-- turnstile: a check's outcome from its policies' decisions, the same on every path (fast.lua
-- and general.lua call it): the all-or-nothing rule. Composed at the top level, after the
-- algorithms' arithmetic and before fast.lua.

-- The all-or-nothing rule, for a check of cost above 0 denied overall (some policy denied
-- it, so nothing is written): every policy that would have admitted (p.ok) reports its
-- fields as if nothing were consumed — a query's (cost 0), which requery(p, out) writes at
-- out[p.o + 1 ..] — with the leaky bucket's delay 0 (no request joins its queue). Returns
-- requery's error (a table with err), or nil.
local function as_if_nothing_consumed(policies, count, out, requery)
  for i = 1, count do
    local p = policies[i]
    if p.ok then
      local err = requery(p, out)
      if err then return err end
      if p.alg == 3 then out[p.o + 4] = 0 end
    end
  end
  return nil
end
