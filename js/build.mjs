// Builds the committed browser files and HubAgent's module from js/src:
//
//   src/client.ts -> ../agui_hub/static/agui-hub.js   (ES module, @msgpack/msgpack bundled)
//                    ../agui_hub/static/agui-hub.d.ts (its types, one file)
//   src/viewer.ts -> ../agui_hub/static/viewer.js     (the viewer page's script; imports
//                                                      the client from ./agui-hub.js)
//   src/agent.ts  -> dist/agent.js                    (HubAgent; @ag-ui/*, rxjs external)
//
// `node build.mjs --outdir DIR` writes the same files under DIR (DIR/agui_hub/static/...,
// DIR/js/dist/...) instead: the tests build there and compare with the committed files,
// so the output must be the same bytes for the same sources (no timestamps, no absolute
// paths, no source maps).

import { mkdirSync, writeFileSync, existsSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import ts from "typescript";

const JS_DIR = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(JS_DIR, "..");
const SRC = join(JS_DIR, "src");

function parseArgs(argv) {
  let outdir = ROOT;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--outdir" && i + 1 < argv.length) outdir = resolve(argv[++i]);
    else if (argv[i].startsWith("--outdir=")) outdir = resolve(argv[i].slice("--outdir=".length));
    else {
      console.error(`usage: node build.mjs [--outdir DIR]\nunknown argument: ${argv[i]}`);
      process.exit(2);
    }
  }
  return outdir;
}

const OUT = parseArgs(process.argv.slice(2));
const STATIC = join(OUT, "agui_hub", "static");
const DIST = join(OUT, "js", "dist");

function banner(what) {
  return `// ${what}: generated from js/src by \`npm run build\` (agui-hub); do not edit.`;
}

function write(path, text) {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
  console.log(`wrote ${relative(process.cwd(), path) || path}`);
}

async function bundle(entry, outfile, what, options = {}) {
  const result = await build({
    absWorkingDir: JS_DIR, // paths in the output's comments are relative to js/
    entryPoints: [entry],
    bundle: true,
    format: "esm",
    target: "es2022",
    platform: "browser",
    minify: false,
    sourcemap: false,
    charset: "utf8",
    legalComments: "inline",
    banner: { js: banner(what) },
    write: false,
    logLevel: "warning",
    ...options,
  });
  const [file] = result.outputFiles;
  write(outfile, file.text);
  return { text: file.text, metafile: result.metafile };
}

// The viewer page imports the client that the gateway serves at /agui-hub.js rather than
// carrying a second copy of it: the browser fetches the client once, and the page runs the
// very file other pages import. The specifier stays relative ("./agui-hub.js", resolved
// against viewer.js's own URL), so the page also works behind a proxy that serves the
// gateway under a path prefix. Only src/'s own imports of ./client are rewritten.
const CLIENT_URL = "./agui-hub.js";
const servedClient = {
  name: "served-client",
  setup(build) {
    build.onResolve({ filter: /^\.\/client(\.js|\.ts)?$/ }, (args) =>
      args.resolveDir === SRC ? { path: CLIENT_URL, external: true } : undefined,
    );
  },
};

/** Fails the build when *importer* (built text) imports from the served client a name that
 * *clientExports* lacks: with the client external, esbuild no longer checks the pair, and a
 * browser would only say so when the page loads. */
function checkServedImports(importer, text, clientExports) {
  const named = [...text.matchAll(/^import\s*\{([^}]*)\}\s*from\s*"\.\/agui-hub\.js";$/gm)];
  const all = text.split(`from "${CLIENT_URL}"`).length - 1;
  if (named.length !== all) {
    console.error(`${importer}: imports ${CLIENT_URL} other than by name: keep to import { ... }`);
    process.exit(1);
  }
  const names = named.flatMap((m) => m[1].split(",").map((n) => n.trim().split(/\s+/)[0]));
  const missing = names.filter((name) => name !== "" && !clientExports.includes(name));
  if (missing.length > 0) {
    console.error(`${importer}: ${CLIENT_URL} does not export ${missing.join(", ")}`);
    process.exit(1);
  }
}

/** The client's declarations, one file (client.ts is one module: nothing to stitch). */
function declarations(entry, outfile) {
  const options = {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.ESNext,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    lib: ["lib.es2022.d.ts", "lib.dom.d.ts"],
    types: [],
    strict: true,
    skipLibCheck: true,
    declaration: true,
    emitDeclarationOnly: true,
    stripInternal: true,
    removeComments: false,
    newLine: ts.NewLineKind.LineFeed,
  };
  const program = ts.createProgram([join(JS_DIR, entry)], options);
  const diagnostics = ts.getPreEmitDiagnostics(program);
  if (diagnostics.length > 0) {
    const host = {
      getCanonicalFileName: (f) => f,
      getCurrentDirectory: () => JS_DIR,
      getNewLine: () => "\n",
    };
    console.error(ts.formatDiagnostics(diagnostics, host));
    process.exit(1);
  }
  let text = null;
  const result = program.emit(undefined, (name, data) => {
    if (name.endsWith("client.d.ts")) text = data;
  });
  if (result.emitSkipped || text === null) {
    console.error("no declarations emitted for the client");
    process.exit(1);
  }
  if (/^\s*import\s/m.test(text)) {
    console.error("the client's declarations import another module: keep them one file");
    process.exit(1);
  }
  write(outfile, `${banner("agui-hub.d.ts")}\n${text}`);
}

const client = await bundle("src/client.ts", join(STATIC, "agui-hub.js"), "agui-hub.js", {
  metafile: true,
});
const clientExports = Object.values(client.metafile.outputs)[0].exports;
declarations("src/client.ts", join(STATIC, "agui-hub.d.ts"));
if (existsSync(join(SRC, "viewer.ts"))) {
  const viewer = await bundle("src/viewer.ts", join(STATIC, "viewer.js"), "viewer.js", {
    plugins: [servedClient],
  });
  checkServedImports("viewer.js", viewer.text, clientExports);
}
if (existsSync(join(JS_DIR, "src", "agent.ts"))) {
  await bundle("src/agent.ts", join(DIST, "agent.js"), "agent.js", {
    platform: "neutral",
    mainFields: ["module", "main"],
    external: ["@ag-ui/client", "@ag-ui/core", "rxjs", "rxjs/*"],
  });
}
