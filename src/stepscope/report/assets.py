"""The page's stylesheet and script, inlined into every report so the file opens anywhere without a network.

The style follows the reader's light or dark setting (`prefers-color-scheme`) through CSS variables, which the
plots use too, and prints cleanly (no scroll boxes, no filter fields, plots kept whole on a page). The script is
the little a table needs: click (or Enter on) a header to sort, type in the field above to filter rows."""

STYLE = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--head:#f6f8fa;
--warn-bg:#fff8c5;--warn:#6c4400;--c0:#0969da;--c1:#cf222e;--c2:#1a7f37;--c3:#8250df;--c4:#bc4c00;--c5:#1b7c83;
--c6:#bf3989;--c7:#6e7781}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--muted:#9198a1;--line:#3d444d;
--head:#151b23;--warn-bg:#3a2d00;--warn:#e3b341;--c0:#58a6ff;--c1:#ff7b72;--c2:#3fb950;--c3:#bc8cff;
--c4:#ffa657;--c5:#39c5cf;--c6:#ff80c8;--c7:#9198a1}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1280px;padding:0 20px 40px;background:var(--bg);color:var(--fg);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif}
h1{font-size:24px;margin:20px 0 4px}h2{font-size:20px;margin:0 0 6px;padding-top:18px;border-top:1px solid var(--line)}
h3{font-size:15px;margin:16px 0 6px}.count,.meta,.caption,.shown{color:var(--muted);font-weight:normal}
.count{font-size:14px;margin-left:6px}a{color:var(--c0)}code{font:12px ui-monospace,Menlo,Consolas,monospace}
nav ol{columns:3 200px;margin:6px 0 0;padding-left:22px}section{margin-top:22px}
.warn{background:var(--warn-bg);color:var(--warn);border-radius:6px;padding:6px 10px;margin:6px 0}
.table-tools{display:flex;gap:10px;align-items:center;margin:6px 0}
input.filter{font:inherit;padding:3px 8px;border:1px solid var(--line);border-radius:6px;background:var(--bg);
color:var(--fg);min-width:240px}
.table-wrap{max-height:460px;overflow:auto;border:1px solid var(--line);border-radius:6px}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;font-size:13px;width:max-content;min-width:100%}
th,td{padding:3px 10px;border-bottom:1px solid var(--line);text-align:left;white-space:nowrap;vertical-align:top}
th{position:sticky;top:0;background:var(--head);font-weight:600}
table.sortable th{cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
figure{margin:8px 0}svg.plot{display:block;max-width:100%;height:auto;color:var(--fg)}
svg.plot text{fill:currentColor;font-size:11px}.axis{stroke:currentColor;stroke-width:1}
.grid{stroke:var(--line);stroke-width:.6}.line{fill:none;stroke:var(--c);stroke-width:1.6}
.dash{stroke-dasharray:6 4}.dot,.bar{fill:var(--c)}.dot:hover,.bar:hover{opacity:.7}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:4px 0 0 64px}
.legend i{display:inline-block;width:16px;height:3px;margin-right:5px;vertical-align:middle;background:var(--c)}
.legend i.dash{background:repeating-linear-gradient(90deg,var(--c) 0 5px,transparent 5px 8px)}
.s0{--c:var(--c0)}.s1{--c:var(--c1)}.s2{--c:var(--c2)}.s3{--c:var(--c3)}.s4{--c:var(--c4)}.s5{--c:var(--c5)}
.s6{--c:var(--c6)}.s7{--c:var(--c7)}
@media print{body{max-width:none;padding:0;font-size:11px}nav,.table-tools input{display:none}
.table-wrap{max-height:none;overflow:visible;border:0}figure{break-inside:avoid}h2,h3{break-after:avoid}
th{position:static}table{font-size:9px;width:auto}th,td{padding:1px 5px}a{color:inherit;text-decoration:none}}
"""

SCRIPT = """
(function(){
function num(text){var t=text.replace(/,/g,'').trim();var v=parseFloat(t);return t===''||t==='-'||isNaN(v)?null:v}
function sortBy(table,col,th){
  var ascending=th.getAttribute('aria-sort')!=='ascending';
  Array.prototype.forEach.call(th.parentNode.cells,function(c){c.removeAttribute('aria-sort')});
  th.setAttribute('aria-sort',ascending?'ascending':'descending');
  var numeric=th.dataset.type==='n',body=table.tBodies[0],sign=ascending?1:-1;
  var keyed=Array.prototype.map.call(body.rows,function(row,i){
    var text=row.cells[col]?row.cells[col].textContent:'';return [numeric?num(text):text.toLowerCase(),i,row]});
  keyed.sort(function(a,b){
    if(a[0]===null||b[0]===null){return a[0]===b[0]?a[1]-b[1]:(a[0]===null?1:-1)}
    var c=numeric?a[0]-b[0]:a[0].localeCompare(b[0]);return c?sign*c:a[1]-b[1]});
  var fragment=document.createDocumentFragment();
  keyed.forEach(function(k){fragment.appendChild(k[2])});body.appendChild(fragment);
}
document.querySelectorAll('table.sortable').forEach(function(table){
  Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,col){
    th.tabIndex=0;th.title='sort';
    th.addEventListener('click',function(){sortBy(table,col,th)});
    th.addEventListener('keydown',function(e){if(e.key==='Enter'){sortBy(table,col,th)}});
  });
});
document.querySelectorAll('input.filter').forEach(function(input){
  var table=document.getElementById(input.dataset.table),shown=input.parentNode.querySelector('.shown'),timer=0;
  var total=table.tBodies[0].rows.length;
  input.addEventListener('input',function(){clearTimeout(timer);timer=setTimeout(function(){
    var words=input.value.toLowerCase().split(/\\s+/).filter(Boolean),count=0;
    Array.prototype.forEach.call(table.tBodies[0].rows,function(row){
      var text=row.textContent.toLowerCase();
      var keep=words.every(function(w){return text.indexOf(w)>=0});row.hidden=!keep;if(keep){count++}});
    shown.textContent=count===total?total+' rows':count+' of '+total+' rows';
  },120)});
});
})();
"""
