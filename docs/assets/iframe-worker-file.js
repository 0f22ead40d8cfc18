// The site's search on a page opened from disk (file://), where browsers refuse to start a Web
// Worker: Material's search worker runs in a hidden iframe instead, speaking the same messages.
// Written for xclp (no script is fetched from a CDN); listed in mkdocs.yml extra.polyfills, whose
// "iframe-worker" name keeps Material's offline plugin from adding its own shim from unpkg.
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  class FileWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.queue = [];
      this.ready = false;
      const src = new URL(url, document.baseURI).href;
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      // the worker's globals inside the frame: postMessage goes to this page, messages come from it
      this.frame.srcdoc =
        "<script>" +
        "self.postMessage = function (data) { parent.postMessage({fileWorker: data}, '*'); };" +
        "self.importScripts = function () { throw new Error('importScripts is not available offline'); };" +
        "</" + "script><script src=\"" + src.replace(/"/g, "&quot;") + "\"></" + "script>" +
        "<script>parent.postMessage({fileWorkerReady: true}, '*');</" + "script>";
      window.addEventListener("message", (event) => {
        if (event.source !== this.frame.contentWindow || typeof event.data !== "object") return;
        if (event.data.fileWorkerReady) {
          this.ready = true;
          this.queue.splice(0).forEach((data) => this.postMessage(data));
        } else if ("fileWorker" in event.data) {
          const message = new MessageEvent("message", { data: event.data.fileWorker });
          if (this.onmessage) this.onmessage(message);
          this.dispatchEvent(message);
        }
      });
      (document.body || document.documentElement).appendChild(this.frame);
    }

    postMessage(data) {
      if (!this.ready) {
        this.queue.push(data);
        return;
      }
      // dispatched, not posted: the frame's own postMessage is now the worker's, back to this page
      const frame = this.frame.contentWindow;
      frame.dispatchEvent(new frame.MessageEvent("message", { data: structuredClone(data) }));
    }

    terminate() {
      this.frame.remove();
    }
  }

  window.Worker = FileWorker;
})();
