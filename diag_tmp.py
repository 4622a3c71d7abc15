import asyncio, time, re, sys, os
import httpx, grpc
from fairq_bench.processes import sim_process, split_cpus, confined, fairq_process, toml_config
from fairq_bench.flood import fairq_sender
from fairq_bench.workload import replay
from tests.backends.sim_flood import workload, _FAIRQ_CONFIG
from collections import Counter
async def main():
    sim_cpus, other = split_cpus()
    async with sim_process("--mode","vllm","--model","sim","--max-num-seqs","4","--speed","1", cpus=sim_cpus) as url:
        with confined(other):
            async with fairq_process(toml_config(url,"sim","vllm",_FAIRQ_CONFIG)) as target, grpc.aio.insecure_channel(target) as ch:
                samples=[]; stop=False
                async def sampler():
                    async with httpx.AsyncClient() as c:
                        while not stop:
                            t=await c.get(url+"/metrics"); txt=t.text
                            r=re.search(r'^vllm:num_requests_running\S* (\S+)',txt,re.M); w=re.search(r'^vllm:num_requests_waiting\S* (\S+)',txt,re.M)
                            samples.append((float(r.group(1)),float(w.group(1))))
                            await asyncio.sleep(0.02)
                st=asyncio.create_task(sampler())
                t0=time.monotonic()
                res=await replay(workload(), fairq_sender(ch,"sim"))
                print("makespan", time.monotonic()-t0)
                stop=True; await st
                print("running", sorted(Counter(s[0] for s in samples).items()))
                print("waiting", sorted(Counter(s[1] for s in samples).items()))
asyncio.run(main())
