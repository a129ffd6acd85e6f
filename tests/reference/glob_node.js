// Node's own answer for glob vectors: node glob_node.js DIR PATTERN... -> one JSON array per
// pattern, each sorted, from fs.globSync with DIR as the working directory (Node 22+).
const fs = require("fs");
const [dir, ...patterns] = process.argv.slice(2);
process.chdir(dir);
for (const p of patterns) {
  let out;
  try { out = fs.globSync(p).sort(); } catch (e) { out = { error: String(e.message) }; }
  console.log(JSON.stringify(out));
}
