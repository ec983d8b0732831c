"use strict";
var __createBinding = (this && this.__createBinding) || (Object.create ? (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    var desc = Object.getOwnPropertyDescriptor(m, k);
    if (!desc || ("get" in desc ? !m.__esModule : desc.writable || desc.configurable)) {
      desc = { enumerable: true, get: function() { return m[k]; } };
    }
    Object.defineProperty(o, k2, desc);
}) : (function(o, m, k, k2) {
    if (k2 === undefined) k2 = k;
    o[k2] = m[k];
}));
var __exportStar = (this && this.__exportStar) || function(m, exports) {
    for (var p in m) if (p !== "default" && !Object.prototype.hasOwnProperty.call(exports, p)) __createBinding(exports, m, p);
};
Object.defineProperty(exports, "__esModule", { value: true });
exports.Consumer = exports.Producer = exports.traceparentOf = exports.backoffPolicy = exports.defaultErrorPolicy = exports.Poison = exports.RetryLater = exports.QUEUE_MODE = void 0;
/** queen for Node.js: a producer and a consumer loop for queen, the message queue inside
 * PostgreSQL, on node-postgres. */
var common_1 = require("./common");
Object.defineProperty(exports, "QUEUE_MODE", { enumerable: true, get: function () { return common_1.QUEUE_MODE; } });
Object.defineProperty(exports, "RetryLater", { enumerable: true, get: function () { return common_1.RetryLater; } });
Object.defineProperty(exports, "Poison", { enumerable: true, get: function () { return common_1.Poison; } });
Object.defineProperty(exports, "defaultErrorPolicy", { enumerable: true, get: function () { return common_1.defaultErrorPolicy; } });
Object.defineProperty(exports, "backoffPolicy", { enumerable: true, get: function () { return common_1.backoffPolicy; } });
Object.defineProperty(exports, "traceparentOf", { enumerable: true, get: function () { return common_1.traceparentOf; } });
var producer_1 = require("./producer");
Object.defineProperty(exports, "Producer", { enumerable: true, get: function () { return producer_1.Producer; } });
var consumer_1 = require("./consumer");
Object.defineProperty(exports, "Consumer", { enumerable: true, get: function () { return consumer_1.Consumer; } });
__exportStar(require("./errors"), exports);
