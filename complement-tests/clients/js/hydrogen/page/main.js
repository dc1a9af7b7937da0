// The whole Hydrogen app, as hydrogen-view-sdk exports it. flow.mjs bundles
// this with esbuild and serves it with the package's assets, its service
// worker (sw.js, which adds the access token to media requests) and olm.
import { FeatureSet, Platform, RootViewModel, createNavigation, createRouter } from "hydrogen-view-sdk";

const assetPaths = {
    downloadSandbox: "assets/download-sandbox.html",
    worker: "assets/main.js",
    serviceWorker: "sw.js",
    olm: { wasm: "olm/olm.wasm", wasmBundle: "olm/olm.js", legacyBundle: "olm/olm_legacy.js" },
};

async function main() {
    const container = document.getElementById("app");
    const platform = new Platform({ container, assetPaths, config: {}, options: { development: false } });
    const navigation = createNavigation();
    platform.setNavigation(navigation);
    await platform.init();
    const urlRouter = createRouter({ navigation, history: platform.history });
    urlRouter.attach();
    const features = await FeatureSet.load(platform.settingsStorage);
    const vm = new RootViewModel({ platform, navigation, urlRouter, features });
    await vm.load();
    platform.createAndMountRootView(vm);
    document.body.dataset.ready = "yes";
}

main().catch((e) => {
    document.body.dataset.error = String(e?.stack ?? e);
    console.error(e);
});
